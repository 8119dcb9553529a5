"""Disaggregation is honest: router -> prefill rank -> KV pool -> decode rank yields exactly the
single-process engine's greedy tokens, cold, after a local prefix hit and after a pool hit."""

from __future__ import annotations

import grpc
import httpx
import pytest

from rackserve.config import load_config
from rackserve.model import tokenizer
from rackserve.model.config import ModelConfig
from rackserve.model.engine import Engine
from rackserve.model.sampling import SamplingParams
from services._proto import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from services.launcher import DEFAULT_CONFIG

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"


def reference_tokens(prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of the single-process engine (same config as the cluster), cold cache."""
    cfg = load_config(DEFAULT_CONFIG)
    engine = Engine.from_config(
        ModelConfig.from_sections(cfg.engine, cfg.engram),
        num_blocks=512,
        max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
    )
    engine.add_request(
        "ref", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    )
    out: list[int] = []
    while engine.has_unfinished():
        out += [o.token for o in engine.step().outputs if o.token is not None]
    return out


def complete(base: str, prompt: list[int], n: int) -> dict:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    reply = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_cluster_equals_single_process_cold_and_after_prefix_hit(live_cluster) -> None:
    prompt = tokenizer.encode(
        "Disaggregated serving moves KV from prefill to decode. " * 3, bos=True
    )
    want = reference_tokens(prompt, 16)
    cold = complete(live_cluster.base_url, prompt, 16)
    assert cold["choices"][0]["token_ids"] == want
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    warm = complete(live_cluster.base_url, prompt, 16)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * ((len(prompt) - 1) // 16)
    assert warm["choices"][0]["token_ids"] == want


def test_second_turn_hits_cache_and_has_lower_simulated_ttft(live_cluster) -> None:
    system = "You are the twin of a rack of GPUs; answer briefly. " * 12
    turn1 = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is a KV pool?"},
    ]
    url = f"{live_cluster.base_url}/v1/chat/completions"
    first = httpx.post(
        url,
        json={"model": MODEL, "messages": turn1, "max_tokens": 8, "temperature": 0},
        timeout=120,
    ).json()
    answer = first["choices"][0]["message"]["content"]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And Engram?"},
    ]
    second = httpx.post(
        url,
        json={"model": MODEL, "messages": turn2, "max_tokens": 8, "temperature": 0},
        timeout=120,
    ).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert (
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
        > 0.8 * first["usage"]["prompt_tokens"]
    )
    assert second["rackserve"]["ttft_s"] < first["rackserve"]["ttft_s"]
    assert second["rackserve"]["prefill_s"] < first["rackserve"]["prefill_s"]


def test_pool_hit_on_the_other_rank_then_decode_equals_reference(live_cluster) -> None:
    """Prefill on DP rank 0, then the same prompt on rank 1: its KV comes from the pool; the
    decode rank loads it by handle and continues with the reference tokens."""
    prompt = tokenizer.encode("Pooled KV crosses ranks through Redis. " * 4, bos=True)
    want = reference_tokens(prompt, 10)
    params = prefill_pb2.SamplingParams(temperature=0, top_p=1, max_tokens=10, ignore_eos=True)
    with grpc.insecure_channel(live_cluster.urls["prefill (gRPC)"]) as channel:
        stub = prefill_pb2_grpc.PrefillStub(channel)
        first = stub.Prefill(
            prefill_pb2.PrefillRequest(
                request_id="pool-a",
                instance="prefill-dep2-0",
                dp_rank=0,
                token_ids=prompt,
                sampling=params,
            )
        )
        second = stub.Prefill(
            prefill_pb2.PrefillRequest(
                request_id="pool-b",
                instance="prefill-dep2-0",
                dp_rank=1,
                token_ids=prompt,
                sampling=params,
            )
        )
    full_blocks = (len(prompt) - 1) // 16
    assert first.first_token == second.first_token == want[0]
    assert second.pool_hit_tokens == 16 * full_blocks and second.local_hit_tokens == 0
    assert len(second.kv.block_hashes) == len(prompt) // 16
    for instance, rank in (("decode-wide-ep-0", 3), ("decode-tp8-0", 0)):
        with grpc.insecure_channel(live_cluster.urls["decode (gRPC)"]) as channel:
            chunks = list(
                decode_pb2_grpc.DecodeStub(channel).Generate(
                    decode_pb2.DecodeRequest(
                        request_id=f"pool-{instance}",
                        instance=instance,
                        rank=rank,
                        token_ids=prompt,
                        first_token=second.first_token,
                        kv=second.kv,
                        sampling=params,
                    )
                )
            )
        assert [t for c in chunks for t in c.token_ids] == want
        assert chunks[-1].finish_reason == "length"
        assert chunks[0].kv_load_sim_s > 0


def test_unknown_rank_is_invalid_argument(live_cluster) -> None:
    with grpc.insecure_channel(live_cluster.urls["prefill (gRPC)"]) as channel:
        with pytest.raises(grpc.RpcError) as err:
            prefill_pb2_grpc.PrefillStub(channel).Prefill(
                prefill_pb2.PrefillRequest(
                    request_id="bad", instance="prefill-dep2-0", dp_rank=7, token_ids=[1, 2, 3]
                )
            )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dp_rank" in err.value.details()
