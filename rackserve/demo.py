"""`rackserve demo`: the small MoE engine in one process, showing completions, a prefix-cache hit on
a conversation's second turn, and cache statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from rackserve.config import Config
from rackserve.model import tokenizer as tok
from rackserve.model.engine import Engine
from rackserve.model.sampling import SamplingParams
from rackserve.model.threads import limit_blas_threads

SYSTEM = "You are a terse assistant on a rack of GPUs. Answer in one line."
TURN_1 = "What does a prefix cache store?"
TURN_2 = "And why does the second turn of a chat hit it?"
BATCH = ["Name three colors.", "Count to five.", "Say hello in French.", "What is a KV block?"]


@dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_tokens: int
    cached_tokens: int
    output: list[int]
    seconds: float


def complete(
    engine: Engine, prompts: dict[str, list[int]], params: SamplingParams
) -> list[Completion]:
    """Run prompts as one batch until all finish."""
    started = time.perf_counter()
    cached = {
        rid: engine.add_request(rid, ids, params).num_cached_tokens for rid, ids in prompts.items()
    }
    outputs: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.token is not None:
                outputs[out.request_id].append(out.token)
    seconds = time.perf_counter() - started
    return [
        Completion(rid, len(prompts[rid]), cached[rid], outputs[rid], seconds) for rid in prompts
    ]


def _table(title: str, completions: list[Completion]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("request", "prompt", "cached", "computed", "output"):
        table.add_column(column, no_wrap=True, justify="right" if column != "request" else "left")
    table.add_column("text", overflow="fold", ratio=1)
    for c in completions:
        style = "bold green" if c.cached_tokens else ""
        table.add_row(
            c.request_id,
            str(c.prompt_tokens),
            f"[{style}]{c.cached_tokens}[/]" if style else "0",
            str(c.prompt_tokens - c.cached_tokens),
            str(len(c.output)),
            repr(tok.decode(c.output)),
        )
    return table


def _stats_table(engine: Engine, events: int) -> Table:
    stats = engine.stats()
    table = Table(title="KV cache (this rank)", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("blocks (capacity)", stats.cache.num_blocks),
        ("blocks cached (findable by hash)", stats.cache.num_cached),
        ("blocks free / evictable", stats.cache.num_free),
        ("prefix blocks hit / looked up", f"{stats.cache.hits} / {stats.cache.queries}"),
        ("block hit rate", f"{stats.cache.hit_rate:.0%}"),
        ("tokens computed", stats.computed_tokens),
        ("tokens reused from cache", stats.reused_tokens),
        ("evictions", stats.cache.evictions),
        ("KV events emitted (stored/removed)", events),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def run_demo(config: Config, max_tokens: int = 24, console: Console | None = None) -> Engine:
    """Print the demo; returns the engine so a test can inspect it."""
    console = console or Console()
    limit_blas_threads(1)
    engine = Engine.from_deployment(config)
    cfg = engine.cfg
    console.print(
        Panel.fit(
            f"[bold]rackserve demo[/]: small MoE ({cfg.n_layers} layers, d={cfg.d_model}, "
            f"{cfg.n_experts} experts top-{cfg.top_k} + shared, 1 KV head, Engram at layers "
            f"{list(cfg.engram_layers)}), block_size={cfg.block_size}, seed={cfg.seed}.\n"
            "Weights are random (seeded), so the text is gibberish; the KV mechanics are real.",
        )
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=cfg.seed)
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURN_1}]
    (first,) = complete(engine, {"chat-turn-1": tok.apply_chat_template(chat)}, params)
    console.print(_table("Turn 1 (cold cache)", [first]))
    console.print(f"turn 1 output token ids: {first.output}")

    # The next turn resends the conversation: turn 1's prompt, the reply's exact tokens, a new message.
    next_message = tok.apply_chat_template([{"role": "user", "content": TURN_2}])[1:]  # without BOS
    turn_2 = tok.apply_chat_template(chat) + first.output + [tok.END] + next_message
    (second,) = complete(engine, {"chat-turn-2": turn_2}, params)
    console.print(_table("Turn 2 (same conversation: its prefix is cached)", [second]))
    console.print(
        f"[bold green]prefix-cache hit:[/] {second.cached_tokens} of {second.prompt_tokens} prompt tokens "
        f"reused ({second.cached_tokens // cfg.block_size} blocks), "
        f"{second.prompt_tokens - second.cached_tokens} computed."
    )
    batch = {
        f"batch-{i}": tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        )
        for i, q in enumerate(BATCH)
    }
    completions = complete(engine, batch, params)
    console.print(_table(f"A batch of {len(batch)} (shared system prompt)", completions))
    console.print(
        f"batch of {len(batch)} decoded together in {completions[0].seconds * 1000:.0f} ms"
    )
    console.print(_stats_table(engine, len(engine.drain_events())))
    return engine
