"""`rackserve bench`: drive a running cluster over streaming HTTP, like `vllm bench serve`.

    python -m services.bench --url http://127.0.0.1:8000 --trace trace.jsonl --request-rate 2
    python -m services.bench --url ... --trace data/agentx/claude_code_traces_dev.jsonl.gz \
        --concurrency 8 --duration 120 --measure-start 30
    python -m services.bench --url ... --agentx --concurrency 8 --agentx-sessions 16 --duration 60

--trace takes Mooncake records or recorded agentic conversations (told apart by content, .gz too);
conversations replay as AgentX lanes (warm-ups left out of the figures), scaled to fit the model's
context (max_model_len of /v1/models) or refused up front. Prints the familiar summary (in
simulated seconds, using the cluster's time_scale), plus the cached-token share, rank idle time and
context overflows; --save-result writes vLLM-named JSON; --plot writes PNGs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rackserve.workload.spec import DEEPSEEK_V4_MAX_CONTEXT, AgentXTraceWorkload, AgentXWorkload
from rackserve.workload.trace_file import read_conversations, trace_format
from rackserve.workload.trace_replay import TraceReplaySource
from services.bench.client import (
    cluster_info,
    metrics_text,
    model_context,
    rank_idle_pct,
    stream_completion,
)
from services.bench.context_fit import (
    ContextFitError,
    check_agentx_fits,
    fit_length_scale,
    trace_lengths,
)
from services.bench.outcome import Outcome
from services.bench.plots import write_plots
from services.bench.runner import Runner
from services.bench.summary import format_summary, summarize
from services.bench.workload import BenchWorkload

DEFAULT_LANES = 8  # --trace conversations without --concurrency
DEFAULT_TRACE_DURATION_S = 60.0  # --trace conversations without --duration (lanes recycle forever)
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
    src.add_argument("--trace", help="Mooncake or AgentX conversation JSONL (.gz too), by content")
    src.add_argument("--agentx", action="store_true", help="AgentX-like agentic sessions")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="use the first N trace records (conversations: the first N conversations)")
    p.add_argument("--length-scale", type=float, default=None,
                   help="scale trace lengths (default: Mooncake 1; conversations: fit the model's context)")
    p.add_argument("--measure-start", type=float, default=0.0,
                   help="measured window start, simulated s (requests scheduled before are not counted)")
    p.add_argument("--measure-length", type=float, default=None,
                   help="measured window length, simulated s (default: to the end)")
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
    if args.length_scale is not None and not 0 < args.length_scale <= 1:
        p.error(f"--length-scale: must be in (0, 1], got {args.length_scale}")
    if args.request_rate is not None and (args.agentx or args.request_rate <= 0):
        p.error(
            "--request-rate: a positive rate, with --trace only (agentx load is set by --concurrency)"
        )
    return args


def conversation_spec(args: argparse.Namespace, context: int | None) -> AgentXTraceWorkload:
    """AgentX lanes over a conversation trace, at the length scale that fits `context`."""
    prompts, outputs = trace_lengths(read_conversations(args.trace, args.num_prompts))
    scale = fit_length_scale(prompts, outputs, context, args.length_scale) if context else args.length_scale or 1.0
    if args.request_rate is not None:
        raise ContextFitError("--request-rate: conversation traces are closed loop (load = --concurrency lanes)")
    return AgentXTraceWorkload(
        kind="agentx-trace", trace=args.trace, limit=args.num_prompts, seed=args.seed,
        concurrency=args.concurrency or DEFAULT_LANES, max_context=context or DEEPSEEK_V4_MAX_CONTEXT,
        length_scale=scale, duration_s=args.duration or DEFAULT_TRACE_DURATION_S,
        measure_start_s=args.measure_start, measure_s=args.measure_length,
    )  # fmt: skip


def build_workload(args: argparse.Namespace, context: int | None) -> BenchWorkload:
    """The load to send; ValueError (ContextFitError included) when it cannot run as asked."""
    if args.trace and trace_format(args.trace) == "conversation":
        return BenchWorkload.from_conversations(conversation_spec(args, context))
    if args.trace:
        scale = 1.0 if args.length_scale is None else args.length_scale
        return BenchWorkload.from_trace(args.trace, args.num_prompts, scale, args.request_rate, args.seed)
    spec = {field: getattr(args, f"agentx_{flag}") for flag, field in AGENTX_FIELDS.items()}
    workload = AgentXWorkload(kind="agentx", seed=args.seed, concurrency=args.concurrency or 1,
                              duration_s=args.duration, **spec)  # fmt: skip
    if context is not None:
        check_agentx_fits(workload, context)
    return BenchWorkload.from_agentx(workload)


async def bench(args: argparse.Namespace, console: Console) -> dict:
    base = args.url.rstrip("/")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(600.0, connect=10.0), limits=limits
    ) as client:
        info = await cluster_info(client, base)
        try:
            workload = build_workload(args, await model_context(client, base))
        except (ValueError, OSError) as exc:
            raise SystemExit(f"rackserve bench: {exc}") from None
        if isinstance(workload.source, TraceReplaySource):
            wl = workload.source.spec
            console.print(f"replaying {args.trace}: {wl.concurrency} lanes, length scale {wl.length_scale:.4g} "
                          f"for a {wl.max_context:,}-token context, {wl.duration_s:g} s", soft_wrap=True)  # fmt: skip
        before = await metrics_text(client, base)
        with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
                      TimeElapsedColumn(), console=console, disable=args.no_progress) as bar:  # fmt: skip
            task = bar.add_task("requests", total=workload.total, failed=0)

            def done(o: Outcome) -> None:
                bar.advance(task)
                if not o.success:
                    bar.update(task, failed=bar.tasks[task].fields["failed"] + 1)

            async def send(out: Outcome, prompt: list[int]) -> Outcome:
                return await stream_completion(client, base, info["model"], out, prompt)

            lanes = args.agentx or isinstance(workload.source, TraceReplaySource)
            concurrency = None if lanes else args.concurrency  # lanes already bound it
            duration = workload.source.spec.duration_s if isinstance(workload.source, TraceReplaySource) else args.duration
            runner = Runner(workload, send, float(info["time_scale"]), concurrency=concurrency,
                            duration_s=duration, on_done=done)  # fmt: skip
            run = await runner.run()
        after = await metrics_text(client, base)
    unsent = workload.stats().overflows if workload.stats else 0
    result = summarize(run.outcomes, run.wall_duration_s, float(info["time_scale"]), model_id=info["model"],
                       request_rate=args.request_rate, max_concurrency=args.concurrency,
                       rank_idle_pct=rank_idle_pct(before, after), measure_start_s=args.measure_start,
                       measure_s=args.measure_length, unsent_overflows=unsent)  # fmt: skip
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
    if result["completed"] == 0:
        why = Counter(result["errors"]).most_common(1)
        console.print(f"[red]rackserve bench: none of the {result['num_prompts']} measured requests succeeded"
                      + (f" ({why[0][1]} x {why[0][0]})" if why else "") + "; no result table[/red]")  # fmt: skip
        return 1
    print(format_summary(result))
    if args.save_result:
        console.print(f"result: {save(result, args)}")
    if args.plot:
        for path in write_plots(result, args.plot):
            console.print(f"plot: {path}")
    return 0 if result["failed"] == 0 and result["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
