"""prefill service."""
