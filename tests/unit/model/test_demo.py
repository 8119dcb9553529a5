"""`rackserve demo` prints completions and a real prefix-cache hit on the second turn."""

from __future__ import annotations

import io

from rich.console import Console

from rackserve.config import Config
from rackserve.demo import run_demo


def test_demo_shows_a_cache_hit():
    out = io.StringIO()
    engine = run_demo(Config(), max_tokens=4, console=Console(file=out, width=120))
    text = out.getvalue()
    # turn 1: a 101-token prompt + 4 outputs, of which 104 tokens were computed -> 6 full blocks
    assert "prefix-cache hit: 96 of" in text
    assert engine.stats().reused_tokens >= 96 and engine.stats().cache.hits >= 6
    assert "KV cache (this rank)" in text and not engine.has_unfinished()
