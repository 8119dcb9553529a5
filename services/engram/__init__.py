"""engram service."""
