"""router service."""
