"""Outside load clients against `rackserve up`: their wall-clock figures beside the twin's simulated
ones, at a time_scale this machine can hold (`--time-scale auto`, services/time_scale_probe.py).

For each client run the script reads the server's simulated TTFT and TPOT means (sum / count of the
front door's rackserve_time_to_first_token_seconds / _time_per_output_token_seconds over the run)
and the pacing lag the ranks accrued, and puts client_ms beside sim_ms x time_scale: when the
clock holds (lag ~0) the two agree up to the front door's own overhead (bench/frontdoor/overhead.py).

    .venv/bin/python bench/clients/outside_clients.py [--time-scale auto] [--requests 16] [--concurrency 4]
AIPerf runs from .venv-aiperf (built by .ci/run), guidellm from .venv-guidellm when present
(bench/clients/guidellm.py builds it), `vllm bench serve` from .venv-vllm when present (bench/clients/vllm_bench.py
builds it). Writes bench/results/clients/outside_clients.json and prints a table; each row also carries the
server's prompt and output token counts over the client's run beside the client's own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rackserve.model.hf_tokenizer import path as tokenizer_path  # noqa: E402
from services.redis_server import free_port  # noqa: E402
from tests.e2e.launcher_proc import LauncherProcess, launcher_command  # noqa: E402

MODEL = "rackserve-moe-small"
SUMS = {
    "ttft": "rackserve_time_to_first_token_seconds",
    "tpot": "rackserve_time_per_output_token_seconds",
}
LAG = "rackserve_rank_pacing_lag_seconds"
TOKENS = "rackserve_tokens_total"  # {kind=cached|uncached|output}
VLLM = REPO / ".venv-vllm/bin/vllm"


def server_totals(base: str) -> dict[str, float]:
    """Sums and counts of the simulated-latency histograms, and the ranks' total pacing lag."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, name in SUMS.items():
                if sample.name in (f"{name}_sum", f"{name}_count"):
                    suffix = sample.name.rsplit("_", 1)[1]
                    out[f"{key}_{suffix}"] = out.get(f"{key}_{suffix}", 0.0) + sample.value
            if sample.name == f"{LAG}_total":
                out["lag_s"] = out.get("lag_s", 0.0) + sample.value
            if sample.name == TOKENS:
                key = "output_tokens" if sample.labels.get("kind") == "output" else "prompt_tokens"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def simulated(before: dict, after: dict) -> dict:
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    mean = {k: delta[f"{k}_sum"] / delta[f"{k}_count"] if delta.get(f"{k}_count") else None
            for k in SUMS}
    return {"sim_ttft_ms": _ms(mean["ttft"]), "sim_tpot_ms": _ms(mean["tpot"]),
            "requests": delta.get("ttft_count", 0.0), "pacing_lag_s": delta.get("lag_s", 0.0),
            "server_prompt_tokens": delta.get("prompt_tokens", 0.0),
            "server_output_tokens": delta.get("output_tokens", 0.0)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def aiperf(base: str, out: Path, endpoint: str, args: argparse.Namespace) -> tuple[list[str], dict]:
    cmd = [str(REPO / ".venv-aiperf/bin/aiperf"), "profile", "--model", MODEL, "--url", base,
           "--endpoint-type", endpoint, "--streaming", "--tokenizer", str(tokenizer_path()),
           "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
           "--isl", str(args.isl), "--osl", str(args.osl), "--extra-inputs", "ignore_eos:true",
           "--use-server-token-count", "--ui-type", "none", "--no-server-metrics",
           "--artifact-dir", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    return cmd, {
        "ttft_ms": summary["time_to_first_token"]["avg"],
        "itl_ms": summary["inter_token_latency"]["avg"],
        "requests": summary["request_count"]["avg"],
        "errors": summary.get("error_summary") or [],
    }


def guidellm(base: str, out: Path, args: argparse.Namespace) -> tuple[list[str], dict]:
    """guidellm 0.8.1 (`kind=...,key=value` options), streaming completions; it always asks for
    stream_options.continuous_usage_stats and counts tokens with --tokenizer."""
    report_path = out / "guidellm.json"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(REPO / ".venv-guidellm/bin/guidellm"), "run",
           "--backend", f"kind=openai_http,target={base},model={MODEL},"
                        "request_format=/v1/completions",
           "--profile", f"kind=concurrent,streams={args.concurrency}",
           "--constraint", f"kind=max_requests,count={args.requests}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer_path()}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.isl},output_tokens={args.osl}",
           "--output", f"kind=json,path={report_path}", "--disable-console-interactive"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"guidellm failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return cmd, guidellm_figures(json.loads(report_path.read_text()))


def guidellm_figures(report: dict) -> dict:
    metrics = report["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    return {
        "ttft_ms": metrics["time_to_first_token_ms"]["successful"]["mean"],
        "itl_ms": metrics["inter_token_latency_ms"]["successful"]["mean"],
        "requests": totals["successful"],
        "errors": totals["errored"],
    }


def vllm_bench(base: str, out: Path, chat: bool, dataset: str, args: argparse.Namespace
               ) -> tuple[list[str], dict]:
    """`vllm bench serve` (streams; counts with --tokenizer), completions or chat, on its random
    dataset or on a small custom JSONL of prompts written here."""
    out.mkdir(parents=True, exist_ok=True)
    if dataset == "random":
        data = ["--dataset-name", "random", "--random-input-len", str(args.isl),
                "--random-output-len", str(args.osl)]
    else:
        prompts = out / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": f"Question {i}: what limits decode speed "
                                                         "on a rack of 72 GPUs, and why?"}) + "\n"
                                   for i in range(args.requests)))
        data = ["--dataset-name", "custom", "--dataset-path", str(prompts),
                "--custom-output-len", str(args.osl)]
    endpoint = ("openai-chat", "/v1/chat/completions") if chat else ("openai", "/v1/completions")
    cmd = [str(VLLM), "bench", "serve", "--backend", endpoint[0], "--base-url", base,
           "--endpoint", endpoint[1], "--model", MODEL, "--tokenizer", str(tokenizer_path()),
           *data, "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
           "--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", str(out),
           "--result-filename", "vllm.json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{(done.stdout + done.stderr)[-3000:]}")
    result = json.loads((out / "vllm.json").read_text())
    return cmd, {"ttft_ms": result["mean_ttft_ms"], "itl_ms": result["mean_itl_ms"],
                 "requests": result["completed"], "errors": result["failed"],
                 "client_prompt_tokens": result["total_input_tokens"],
                 "client_output_tokens": result["total_output_tokens"]}


def run(args: argparse.Namespace) -> dict:
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    proc = LauncherProcess(
        launcher_command("--port", str(free_port()), "--time-scale", args.time_scale), env=env
    ).start(timeout_s=300)
    rows, tmp = [], Path(tempfile.mkdtemp(prefix="rackserve-clients-"))
    try:
        base = proc.base_url
        scale = httpx.get(f"{base}/v1/models").json()["data"][0]["time_scale"]
        picked = next((ln.strip() for ln in proc.lines if "time_scale auto" in ln), "")
        clients = [("aiperf completions", lambda o: aiperf(base, o, "completions", args)),
                   ("aiperf chat", lambda o: aiperf(base, o, "chat", args))]
        if (REPO / ".venv-guidellm/bin/guidellm").exists():
            clients.append(("guidellm", lambda o: guidellm(base, o, args)))
        if VLLM.exists():
            clients += [(f"vllm bench {kind} {data}", lambda o, c=kind == "chat", d=data:
                         vllm_bench(base, o, c, d, args))
                        for kind in ("completions", "chat") for data in ("random", "custom")]
        only = [c.strip() for c in args.clients.split(",") if c.strip()]
        clients = [c for c in clients if not only or any(c[0].startswith(o) for o in only)]
        for name, client in clients:
            before = server_totals(base)
            cmd, figures = client(tmp / name.replace(" ", "-"))
            sim = simulated(before, server_totals(base))
            rows.append({"client": name, "command": " ".join(cmd), **figures, **sim,
                         "expected_ttft_ms": sim["sim_ttft_ms"] * scale,
                         "expected_itl_ms": sim["sim_tpot_ms"] * scale})
    finally:
        proc.stop()
    return {"time_scale": scale, "picked": picked, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", default="auto")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=32)
    parser.add_argument("--out", default="outside_clients.json", help="file name in bench/results/clients/")
    parser.add_argument("--clients", default="", help="only the clients whose names start with "
                        "one of these, comma-separated (e.g. 'vllm bench')")
    args = parser.parse_args()
    started = time.time()
    result = run(args)
    result |= {"command": "python bench/clients/outside_clients.py " + " ".join(sys.argv[1:]),
               "machine": {"cpus": os.cpu_count(), "load_1m": os.getloadavg()[0],
                           "python": platform.python_version()},
               "wall_s": round(time.time() - started, 1)}
    out = REPO / "bench" / "results" / "clients" / args.out
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"time_scale {result['time_scale']:g}  {result['picked']}")
    # (sim x scale: the server's mean simulated TTFT / TPOT over the client's run, x time_scale)
    print(f"{'client':30s} {'TTFT ms':>9s} {'sim x scale':>11s} {'ITL ms':>8s} {'sim x scale':>11s}"
          f" {'lag s':>7s} {'errors':>6s} {'out tok (server)':>16s}")
    for r in result["rows"]:
        errors = len(r["errors"]) if isinstance(r["errors"], list) else r["errors"]
        print(f"{r['client']:30s} {r['ttft_ms']:9.1f} {r['expected_ttft_ms']:11.1f} "
              f"{r['itl_ms']:8.1f} {r['expected_itl_ms']:11.1f} {r['pacing_lag_s']:7.2f} "
              f"{errors:6} {r['server_output_tokens']:16.0f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
