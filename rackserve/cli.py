"""The `rackserve` command line: each area registers its own sub-command module here."""

from __future__ import annotations

import os
import sys

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="rackserve: a runnable twin of a disaggregated inference rack")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def up(ctx: typer.Context) -> None:
    """Start the live cluster on this machine (see `rackserve up --help`)."""
    # The launcher is network code: run it as its own process so the core stays free of it.
    os.execv(sys.executable, [sys.executable, "-m", "services.launcher", *ctx.args])


if __name__ == "__main__":
    app()
