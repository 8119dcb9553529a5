"""decode service."""
