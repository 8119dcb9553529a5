"""NVIDIA Dynamo's side of bench/frontdoor/overhead.py: its frontend + mocker workers under the same load.

Starts, on 127.0.0.1 only, Dynamo 1.6.1's OpenAI frontend (`python -m dynamo.frontend`) and N
mocker workers (`python -m dynamo.mocker`, no model math, step timing sped up by
`--speedup-ratio`), wired with `--discovery-backend file --request-plane tcp --event-plane zmq`,
from the peer venv `.venv-peers` (see ../shared/ENVIRONMENT.md). The mockers read a local
byte-level tokenizer directory (`.venv-peers/tok`, made by `make_tokenizer`, nothing downloaded),
so a PROMPT_CHARS-byte prompt is PROMPT_CHARS tokens on both sides. The load is bench/frontdoor/overhead.py's
own client code (`cluster_latency`, `cluster_rate`): same prompts, max_tokens, concurrency, count.
Every process started here is stopped by its PID (process group) at the end.

    .venv/bin/python bench/frontdoor/overhead.py --only dynamo [--requests 24] [--workers 2]
merges a "dynamo" entry (and the ratios against our figures already in the JSON) into
bench/results/frontdoor/overhead.json; `bench/frontdoor/overhead.py --dynamo` runs both sides in one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.frontdoor import stream_client  # the same client code and workload constants
from services.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".venv-peers"
PEER_PYTHON = PEERS / "bin" / "python"
TOKENIZER_DIR = PEERS / "tok"
SPEEDUP = 10_000.0


def make_tokenizer(path: Path = TOKENIZER_DIR) -> Path:
    """A byte-level BPE with no merges (1 byte = 1 token) saved as an HF model directory."""
    config = path / "tokenizer_config.json"
    if config.exists() and "chat_template" in config.read_text():
        return path
    script = r"""
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
tok.decoder = decoders.ByteLevel()
alphabet = pre_tokenizers.ByteLevel.alphabet()
trainer = trainers.BpeTrainer(vocab_size=len(alphabet), initial_alphabet=alphabet,
                              show_progress=False)
tok.train_from_iterator([f"sample {i} text" for i in range(50)], trainer)
tok.add_special_tokens(["<|eos|>"])  # id 256: ids 0-255 are the bytes (the mocker emits id 0)
tok.save(str(out / "tokenizer.json"))
eos = tok.token_to_id("<|eos|>")
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": "<|eos|>", "model_max_length": 4096, "clean_up_tokenization_spaces": False,
    "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
(out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "vocab_size": tok.get_vocab_size(), "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "eos_token_id": eos,
    "bos_token_id": eos, "torch_dtype": "bfloat16"}))
(out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
"""
    subprocess.run([str(PEER_PYTHON), "-c", script, str(path)], check=True)
    return path


def peer_env(store: str) -> dict[str, str]:
    """Environment of every Dynamo process: file discovery in `store`, every listener local."""
    local = "127.0.0.1"
    return {
        **os.environ,
        "DYN_FILE_KV": store,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_HTTP_HOST": local,
        "DYN_TCP_RPC_HOST": local,
        "DYN_TCP_RESPONSE_STREAM_HOST": local,
        "DYN_EVENT_PLANE_HOST": local,
        "DYN_SYSTEM_HOST": local,
        "DYN_LOG": "warn",
        "DYN_SELF_HOST_METADATA": "0",
    }


PLANES = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """One Dynamo process in its own process group (so its children stop with it)."""
    out = log.open("w")
    return subprocess.Popen(
        [str(PEER_PYTHON), "-m", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each started process group by its leader's PID, then SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        try:  # children left in the group after the leader exited
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_ready(base: str, procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Until the frontend lists the model and a completion goes through."""
    deadline = time.monotonic() + timeout_s
    body = {"model": stream_client.MODEL, "prompt": "ready?", "max_tokens": 1}
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a Dynamo process exited during start-up (see its log)")
        try:
            models = httpx.get(f"{base}/v1/models", timeout=2).json().get("data", [])
            if any(m.get("id") == stream_client.MODEL for m in models):
                if httpx.post(f"{base}/v1/completions", json=body, timeout=10).status_code == 200:
                    return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"Dynamo frontend not ready within {timeout_s:.0f} s")


async def chunk_count(base: str) -> int:
    """SSE data chunks of one streamed completion of OUTPUT_TOKENS tokens (checks the load)."""
    body = {
        "model": stream_client.MODEL,
        "prompt": stream_client.prompt_text(77_777),
        "max_tokens": stream_client.OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{base}/v1/completions", json=body) as reply:
            return sum([line.startswith("data: {") async for line in reply.aiter_lines()])


async def dynamo_latency(base: str, n: int) -> dict:
    """overhead.cluster_latency's loop; ITL only if Dynamo streamed more than one text chunk.

    The mocker's tokens detokenize to empty text and Dynamo's frontend sends no chunk for an empty
    delta, so a stream is one data chunk at the end: "TTFT" is then request -> all OUTPUT_TOKENS
    tokens done (an upper bound of Dynamo's TTFT) and ITL cannot be seen by the client.
    """
    ttfts, itls = [], []
    async with httpx.AsyncClient(timeout=120) as client:
        await stream_client.stream_one(client, base, 99_999, 2)
        for i in range(n):
            ttft, gaps = await stream_client.stream_one(
                client, base, 20_000 + i, stream_client.OUTPUT_TOKENS
            )
            ttfts.append(ttft)
            itls += gaps
    return {
        "ttft_ms": stream_client.summary(ttfts),
        "itl_ms": stream_client.summary(itls) if itls else None,
    }


def mocker_commands(mode: str, workers: int, model: list[str]) -> list[list[str]]:
    """The mocker processes: `workers` aggregated ones (mode agg), or (disagg) one prefill mocker,
    its KV handed to one decode mocker (bootstrap rendezvous on a loopback port, the KV transfer's
    time at NVLink's ~450 GB/s the mocker's docs suggest, / the speedup ratio like every step)."""
    base = ["dynamo.mocker", *model, *PLANES, "--speedup-ratio", str(SPEEDUP), "--decode-speedup-ratio",
            str(SPEEDUP), "--num-gpu-blocks-override", "4096", "--block-size", "16", "--max-num-seqs", "256"]
    if mode == "agg":
        return [base] * workers
    if mode != "disagg":
        raise ValueError(f"mode: agg or disagg, got {mode!r}")
    return [[*base, "--disaggregation-mode", "prefill", "--bootstrap-ports", str(free_port()),
             "--kv-transfer-bandwidth", "450"],
            [*base, "--disaggregation-mode", "decode", "--kv-transfer-bandwidth", "450"]]


def run_dynamo(requests: int, rate_requests: int, concurrency: int, workers: int = 2, mode: str = "agg") -> dict:
    """Dynamo frontend + mockers under overhead.py's load; figures like ours. mode agg: `workers`
    aggregated mockers, round-robin; disagg: a prefill and a decode mocker behind its KV router."""
    tok = make_tokenizer()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="dynamo-bench-") as store:
        env = peer_env(store)
        logs = Path(store)
        model = ["--model-path", str(tok), "--model-name", stream_client.MODEL]
        procs = []
        try:
            for w, mocker in enumerate(mocker_commands(mode, workers, model)):
                procs.append(start(mocker, env, logs / f"mocker{w}.log"))
            frontend = ["dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)]
            frontend += [*PLANES, *model, "--router-mode", "round-robin" if mode == "agg" else "kv"]
            procs.append(start(frontend, env, logs / "frontend.log"))
            try:
                wait_ready(base, procs, timeout_s=90)
            except RuntimeError:
                for log in sorted(logs.glob("*.log")):
                    print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
                raise
            chunks = asyncio.run(chunk_count(base))
            figures = {
                **asyncio.run(dynamo_latency(base, requests)),
                **asyncio.run(stream_client.non_stream_latency(base, requests)),
                **asyncio.run(stream_client.cluster_rate(base, rate_requests, concurrency)),
            }
        finally:
            stop(procs)
    return {
        "version": "ai-dynamo 1.6.1 (frontend + mocker)",
        "mode": mode,
        "workers": workers if mode == "agg" else {"prefill": 1, "decode": 1},
        "mocker_speedup_ratio": SPEEDUP,
        "router_mode": "round-robin" if mode == "agg" else "kv",
        "planes": "discovery file, request tcp, event zmq; all on 127.0.0.1",
        "tokenizer": "local byte-level BPE, no merges (1 byte = 1 token), .venv-peers/tok",
        "sse_chunks_per_16_token_stream": chunks,
        **figures,
    }


def mock_comparison(result: dict) -> dict:
    """Equal work (issue 35 item 4): our front door over mock ranks (no model math) against
    Dynamo's frontend over mockers (no model math, steps / speedup ratio). Ours is the mock
    cluster less the in-process mock engine, Dynamo's its whole latency; goal <= 1 each.
    "streamed": TTFT (request -> first SSE chunk) against Dynamo's streamed TTFT (its one chunk
    carries all tokens, see `comparison`); "non_streamed": request -> whole 16-token reply, both."""
    ours, dyn = result["overhead_ms"], result["dynamo"]
    return {
        "streamed": ours["ttft_p50"] / dyn["ttft_ms"]["p50"],
        "non_streamed": ours["non_stream_e2e_p50"] / dyn["non_stream_e2e_ms"]["p50"],
        "ours_ms": {"ttft_p50": ours["ttft_p50"], "non_stream_e2e_p50": ours["non_stream_e2e_p50"]},
        "dynamo_ms": {"ttft_p50": dyn["ttft_ms"]["p50"], "non_stream_e2e_p50": dyn["non_stream_e2e_ms"]["p50"]},
    }


def comparison(result: dict) -> dict:
    """Our added latency (cluster - in-process) against Dynamo's whole frontend+mocker latency."""
    ours, dyn = result["overhead_ms"], result["dynamo"]
    return {
        "ttft_p50_ours_overhead_over_dynamo": ours["ttft_p50"] / dyn["ttft_ms"]["p50"],
        "ttft_p50_ours_overhead_over_dynamo_non_stream_e2e": ours["ttft_p50"]
        / dyn["non_stream_e2e_ms"]["p50"],
        "itl_p50_ours_overhead_over_dynamo": (
            ours["itl_p50"] / dyn["itl_ms"]["p50"] if dyn["itl_ms"] else None
        ),
        "requests_per_s_ours_over_dynamo": result["cluster"]["requests_per_s"]
        / dyn["requests_per_s"],
        "note": (
            "the mocker does no model math and its step times are divided by the speedup ratio, "
            "so Dynamo's absolute TTFT/ITL is (almost) pure frontend + router + request-plane "
            "cost; ours is measured as cluster minus in-process engine. The mocker's tokens "
            "decode to empty text and Dynamo sends no SSE chunk for an empty delta, so its "
            "streams are one chunk: its 'TTFT' is request -> all 16 tokens done (an upper bound "
            "of its TTFT, mocker compute ~0) and its ITL is not visible (null). Most of Dynamo's "
            "streamed requests also stall ~40 ms on the SSE path that non-streamed ones do not "
            "(non_stream_e2e_ms ~4-5 ms for all 16 tokens), so its streamed TTFT is inflated by "
            "that stall; the ratio against non_stream_e2e is the stricter one. The TTFT ratio "
            "compares front-door overheads (goal <= 1); the requests/s ratio does not: our "
            "cluster runs the real small model on the same 2 shared cores, the mocker none."
        ),
    }


def table(result: dict) -> None:
    """Our added latency next to Dynamo's whole latency, and the ratio."""
    dyn, ours = result["dynamo"], result["overhead_ms"]
    rows = [
        ("ttft p50 (stream)", ours["ttft_p50"], dyn["ttft_ms"]["p50"]),
        ("ttft p50 vs non-stream", ours["ttft_p50"], dyn["non_stream_e2e_ms"]["p50"]),
    ]
    if dyn["itl_ms"]:
        rows.append(("itl p50", ours["itl_p50"], dyn["itl_ms"]["p50"]))
    rows.append(
        ("requests/s (cluster)", result["cluster"]["requests_per_s"], dyn["requests_per_s"])
    )
    print(f"{'':24s}{'ours (ovh)':>12s}{'dynamo':>12s}{'ratio':>8s}")
    for name, mine, theirs in rows:
        print(f"{name:24s}{mine:12.2f}{theirs:12.2f}{mine / theirs:8.2f}")


def run_alone(args, command: str) -> None:
    """`overhead.py --only dynamo`: Dynamo's side alone, merged into the JSON beside our figures there."""
    result = json.loads(stream_client.RESULT.read_text())
    result["dynamo"] = run_dynamo(args.requests, args.rate_requests, args.concurrency, args.workers, args.dynamo_mode)
    result["dynamo"]["command"] = command
    result["dynamo"]["load_avg_1m"] = os.getloadavg()[0]
    result["dynamo_ratio"] = comparison(result)
    stream_client.RESULT.write_text(json.dumps(result, indent=2) + "\n")
    table(result)
    print(f"(load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus) -> {stream_client.RESULT}")
