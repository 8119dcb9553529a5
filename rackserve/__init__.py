"""rackserve: a runnable twin of a disaggregated LLM inference rack (core library, no network)."""

__version__ = "0.1.0"
