"""Shared fixtures: real servers started once per test session, stopped by PID."""

from __future__ import annotations

import os

# Every local Ray run binds to loopback and stays offline (see ../shared/ENVIRONMENT.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
