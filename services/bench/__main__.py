"""`rackserve bench`: drive a running cluster over streaming HTTP, like `vllm bench serve`.

    python -m services.bench --url http://127.0.0.1:8000 --trace trace.jsonl --request-rate 2
    python -m services.bench --url ... --agentx --concurrency 8 --agentx-sessions 16 --duration 60

Prints the familiar summary (in simulated seconds, using the cluster's time_scale), plus the
cached-token share and rank idle time; --save-result writes vLLM-named JSON; --plot writes PNGs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rackserve.workload.spec import AgentXWorkload
from services.bench.client import cluster_info, metrics_text, rank_idle_pct, stream_completion
from services.bench.outcome import Outcome
from services.bench.plots import write_plots
from services.bench.runner import Runner
from services.bench.summary import format_summary, summarize
from services.bench.workload import BenchWorkload

AGENTX_FIELDS = {  # flag -> AgentXWorkload field (the rest keep the spec's defaults)
    "sessions": "sessions", "system_tokens": "system_prompt_tokens", "tool_defs_tokens": "tool_defs_tokens",
    "first_user_tokens": "first_user_tokens", "turns_min": "turns_min", "turns_max": "turns_max",
    "tool_output_min": "tool_output_tokens_min", "tool_output_max": "tool_output_tokens_max",
    "output_tokens": "output_tokens", "think_time": "think_time_mean_s",
    "subagent_probability": "subagent_probability", "start_stagger": "start_stagger_s",
}  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rackserve bench", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the cluster's front door")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="Mooncake JSONL trace")
    src.add_argument("--agentx", action="store_true", help="AgentX-like agentic sessions")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N trace records")
    p.add_argument(
        "--length-scale", type=float, default=1.0, help="scale trace prompt/output lengths"
    )
    p.add_argument(
        "--concurrency", type=int, default=None, help="max in flight (agentx: session lanes)"
    )
    p.add_argument(
        "--request-rate", type=float, default=None, help="Poisson req/s (simulated), trace only"
    )
    p.add_argument(
        "--duration", type=float, default=None, help="no new request after this (simulated s)"
    )
    p.add_argument("--seed", type=int, default=0)
    for flag, field in AGENTX_FIELDS.items():
        kind = (
            float
            if field in ("think_time_mean_s", "subagent_probability", "start_stagger_s")
            else int
        )
        default = AgentXWorkload.model_fields[field].default if field != "sessions" else 16
        p.add_argument(
            f"--agentx-{flag.replace('_', '-')}", dest=f"agentx_{flag}", type=kind, default=default
        )
    p.add_argument("--save-result", action="store_true", help="write the result JSON")
    p.add_argument("--result-dir", default=".", help="folder of the result JSON")
    p.add_argument("--result-filename", default=None)
    p.add_argument(
        "--plot", default=None, metavar="DIR", help="write TTFT CDF and per-user speed PNGs"
    )
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.request_rate is not None and (args.agentx or args.request_rate <= 0):
        p.error(
            "--request-rate: a positive rate, with --trace only (agentx load is set by --concurrency)"
        )
    return args


def build_workload(args: argparse.Namespace) -> BenchWorkload:
    if args.trace:
        return BenchWorkload.from_trace(
            args.trace, args.num_prompts, args.length_scale, args.request_rate, args.seed
        )
    spec = {field: getattr(args, f"agentx_{flag}") for flag, field in AGENTX_FIELDS.items()}
    try:
        workload = AgentXWorkload(kind="agentx", seed=args.seed, concurrency=args.concurrency or 1,
                                  duration_s=args.duration, **spec)  # fmt: skip
    except ValueError as exc:
        raise SystemExit(f"rackserve bench: invalid --agentx options: {exc}") from None
    return BenchWorkload.from_agentx(workload)


async def bench(args: argparse.Namespace, console: Console) -> dict:
    base = args.url.rstrip("/")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(600.0, connect=10.0), limits=limits
    ) as client:
        info = await cluster_info(client, base)
        before = await metrics_text(client, base)
        workload = build_workload(args)
        with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
                      TimeElapsedColumn(), console=console, disable=args.no_progress) as bar:  # fmt: skip
            task = bar.add_task("requests", total=workload.total, failed=0)

            def done(o: Outcome) -> None:
                bar.advance(task)
                if not o.success:
                    bar.update(task, failed=bar.tasks[task].fields["failed"] + 1)

            async def send(out: Outcome, prompt: list[int]) -> Outcome:
                return await stream_completion(client, base, info["model"], out, prompt)

            concurrency = args.concurrency if args.trace else None  # agentx lanes already bound it
            runner = Runner(workload, send, float(info["time_scale"]), concurrency=concurrency,
                            duration_s=args.duration, on_done=done)  # fmt: skip
            run = await runner.run()
        after = await metrics_text(client, base)
    result = summarize(run.outcomes, run.wall_duration_s, float(info["time_scale"]), model_id=info["model"],
                       request_rate=args.request_rate, max_concurrency=args.concurrency,
                       rank_idle_pct=rank_idle_pct(before, after))  # fmt: skip
    result["interrupted"] = run.interrupted
    result["max_concurrent_requests"] = run.max_in_flight
    return result


def save(result: dict, args: argparse.Namespace) -> Path:
    name = args.result_filename or f"rackserve-bench-{result['date']}.json"
    path = Path(args.result_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console(stderr=True)
    result = asyncio.run(bench(args, console))
    if result["interrupted"]:
        console.print("[yellow]interrupted: partial summary of the requests that finished[/yellow]")
    print(format_summary(result))
    if args.save_result:
        console.print(f"result: {save(result, args)}")
    if args.plot:
        for path in write_plots(result, args.plot):
            console.print(f"plot: {path}")
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
