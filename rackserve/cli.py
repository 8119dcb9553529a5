"""The `rackserve` command line: each area registers its own sub-command module here."""

from __future__ import annotations

import os
import sys

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="rackserve: a runnable twin of a disaggregated inference rack")

from rackserve.timing.cli import app as timing_app  # noqa: E402

app.add_typer(timing_app, name="timing")

from rackserve.sim.cli import register as register_sim  # noqa: E402

register_sim(app)

from rackserve.validate.cli import register as register_validate  # noqa: E402

register_validate(app)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def up(ctx: typer.Context) -> None:
    """Start the live cluster on this machine (see `rackserve up --help`)."""
    # The launcher is network code: run it as its own process so the core stays free of it.
    os.execv(sys.executable, [sys.executable, "-m", "services.launcher", *ctx.args])


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Benchmark a running cluster over streaming HTTP, like `vllm bench serve` (see `rackserve bench --help`)."""
    os.execv(sys.executable, [sys.executable, "-m", "services.bench", *ctx.args])


@app.command("tokenizer-path")
def tokenizer_path(
    hf_cache: bool = typer.Option(False, "--hf-cache", help="instead: lay the tokenizer out as a "
                                  "Hugging Face hub cache (id = the served model's) and print that "
                                  "cache's folder, for HF_HUB_CACHE (AIPerf's Mooncake replay)"),
) -> None:
    """Print the folder of the model's Hugging Face tokenizer (for a load client's --tokenizer)."""
    if hf_cache:
        from rackserve.model import hf_hub_cache

        print(hf_hub_cache.write())
        return
    from rackserve.model.hf_tokenizer import path

    print(path())


@app.command("trace-text")
def trace_text(
    trace: str = typer.Argument(..., help="Mooncake JSONL trace (hash_ids)"),
    out: str = typer.Argument(..., help="where to write the trace with text_input"),
    block_size: int = typer.Option(512, min=1, help="tokens per hash id in the trace"),
) -> None:
    """Write a Mooncake trace with its prompts as text, for AIPerf's mooncake_trace loader."""
    from rackserve.workload.trace_text import read_records, text_trace

    try:
        records = read_records(trace, block_size)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="TRACE") from None
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(text_trace(records, block_size))


@app.command()
def demo(
    config: str | None = typer.Option(None, help="deployment YAML (default: built-in defaults)"),
    max_tokens: int = typer.Option(24, min=1, help="tokens to generate per completion"),
) -> None:
    """Run the small MoE engine in this process: completions, a prefix-cache hit, cache stats."""
    from rackserve.config import load_config
    from rackserve.demo import run_demo

    run_demo(load_config(config), max_tokens=max_tokens)


if __name__ == "__main__":
    app()
