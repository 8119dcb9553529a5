"""AIPerf (the load client, in its own venv .venv-aiperf built by .ci/run) against the live
cluster: streaming completions and chat at concurrency 4 and a Mooncake-trace replay, with the
packaged tokenizer (`rackserve tokenizer-path`), 0 failures, and AIPerf's token counts equal to
the server's usage."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rackserve.model import hf_hub_cache, hf_tokenizer, tokenizer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
AIPERF = REPO / ".venv-aiperf" / "bin" / "aiperf"
MODEL = "rackserve-moe-small"
BUILD = "python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install aiperf==0.13.0"


@pytest.fixture(scope="module")
def aiperf() -> Path:
    if not AIPERF.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{AIPERF} missing: .ci/run builds it ({BUILD})")
        pytest.skip(f"AIPerf venv missing; build it once: {BUILD}")
    return AIPERF


def profile(aiperf: Path, base_url: str, out: Path, *args: str, hub_cache: Path | None = None
            ) -> list[dict]:
    """Run `aiperf profile` with the packaged tokenizer (its folder, or with `hub_cache` its id in
    that Hugging Face hub cache, offline); its per-request records (profile_export.jsonl)."""
    tokenizer_name = MODEL if hub_cache else str(hf_tokenizer.path())
    cmd = [str(aiperf), "profile", "--model", MODEL, "--url", base_url, "--streaming",
           "--tokenizer", tokenizer_name, "--ui-type", "none", "--no-server-metrics",
           "--random-seed", "7", "--artifact-dir", str(out), *args]
    # With a folder, no HF_HUB_OFFLINE: offline AIPerf looks a tokenizer up only in the hub cache
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"} if hub_cache else None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=out.parent, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    assert all(r.get("error") is None for r in records), [r["error"] for r in records]
    return records


def value(record: dict, name: str) -> float:
    return record["metrics"][name]["value"]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streaming_concurrency_4(aiperf: Path, live_cluster, tmp_path: Path, endpoint: str) -> None:
    records = profile(aiperf, live_cluster.base_url, tmp_path / endpoint, "--endpoint-type",
                      endpoint, "--concurrency", "4", "--request-count", "8", "--isl", "48",
                      "--osl", "12", "--extra-inputs", "ignore_eos:true",
                      "--extra-inputs", "temperature:0")
    assert len(records) == 8
    for r in records:  # AIPerf counted with the packaged tokenizer; the server with its own
        assert value(r, "usage_completion_tokens") == 12
        if endpoint == "completions":  # (for chat AIPerf counts the messages, not the template)
            assert value(r, "input_sequence_length") == value(r, "usage_prompt_tokens")
    # (AIPerf's output count re-encodes the text, which cannot carry a byte model's invalid UTF-8
    # or its special tokens: count output with --use-server-token-count, as below)
    inputs = json.loads((tmp_path / endpoint / "inputs.json").read_text())
    sent = [p for session in inputs["data"] for p in session["payloads"]]
    assert len(sent) == len(records)
    # the server's prompt counts are the packaged tokenizer's counts of what AIPerf sent
    assert sorted(value(r, "usage_prompt_tokens") for r in records) == sorted(
        _prompt_tokens(p) for p in sent)


def _prompt_tokens(payload: dict) -> int:
    """What the packaged tokenizer (not the server) counts for one AIPerf request body."""
    if "messages" in payload:
        return len(tokenizer.apply_chat_template(payload["messages"], special=True))
    return len(tokenizer.encode(payload["prompt"], special=True))


def test_streaming_chat_with_per_chunk_usage(aiperf: Path, live_cluster, tmp_path: Path) -> None:
    """guidellm's and AIPerf's --per-chunk-usage path: stream_options.continuous_usage_stats."""
    records = profile(aiperf, live_cluster.base_url, tmp_path / "chunk", "--endpoint-type", "chat",
                      "--concurrency", "4", "--request-count", "4", "--isl", "32", "--osl", "8",
                      "--use-server-token-count", "--per-chunk-usage",
                      "--extra-inputs", "ignore_eos:true")
    assert len(records) == 4 and all(value(r, "output_sequence_length") == 8 for r in records)


def test_mooncake_trace_replay(aiperf: Path, live_cluster, tmp_path: Path) -> None:
    """A Mooncake trace of 12 records (hash ids at block size 16, shared prefixes) replayed on its
    timestamps: once as hash ids (AIPerf builds the prompts in its offline worker pool, as it
    does from 10 records on, --isl-block-size 16), finding the tokenizer by the model's id in
    `rackserve tokenizer-path --hf-cache`, and once written out as text by `rackserve trace-text`."""
    rows = [{"timestamp": 200 * i, "input_length": 16 * 4 + 5, "output_length": 4,
             "hash_ids": [0, 1, 2, 3, 100 + i] if i % 2 else [7, 8, 9, 10, 200 + i]}
            for i in range(12)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ("--endpoint-type", "completions", "--custom-dataset-type", "mooncake_trace",
              "--fixed-schedule", "--extra-inputs", "ignore_eos:true")
    by_ids = profile(aiperf, live_cluster.base_url, tmp_path / "ids", *common, "--input-file",
                     str(trace), "--isl-block-size", "16",
                     hub_cache=hf_hub_cache.write(tmp_path / "hf-hub"))
    text = tmp_path / "text.jsonl"
    subprocess.run([str(REPO / ".venv" / "bin" / "rackserve"), "trace-text", str(trace), str(text),
                    "--block-size", "16"], check=True, timeout=60)
    by_text = profile(aiperf, live_cluster.base_url, tmp_path / "text", *common, "--input-file",
                      str(text))
    for records in (by_ids, by_text):
        assert len(records) == len(rows)
        assert all(value(r, "usage_prompt_tokens") == 69 for r in records)
        assert all(value(r, "input_sequence_length") == 69 for r in records)
        assert all(value(r, "usage_completion_tokens") == 4 for r in records)
    # the replayed prefixes were served from cache: the later requests of each group hit
    assert sum(value(r, "usage_prompt_cache_read_tokens") for r in by_text) >= 64
