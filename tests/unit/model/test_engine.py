"""Numerics of the engine: prefix hits, chunked prefill, batched decode and KV transfer must not
change what the model computes.

Tolerance: logits are compared with rtol=1e-5 and atol=1e-5 * max|logit|. The same float32 math
runs with different matrix shapes (a 1-row decode vs a 64-row chunk, a batch of 5 vs 1), so BLAS
blocking and reduction order differ; that moves results by a few float32 ulps (~1e-7 relative per
op, amplified by 4 layers), never by 1e-5 unless the math itself differs (e.g. a wrong position,
a missing block, or KV of another token would change logits by O(1)). Greedy tokens must be
identical.
"""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.model.engine import Engine, QueueFull
from rackserve.model.sampling import SamplingParams
from rackserve.model.transformer import query_tile

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
SEEDED = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=1234)


def assert_logits_close(actual: np.ndarray, expected: np.ndarray) -> None:
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale)


def run(
    engine: Engine, request_id: str, prompt: list[int], params: SamplingParams, **kwargs: object
):
    """Add one request and step until it finishes: (tokens, per-token logits, admission)."""
    admission = engine.add_request(request_id, prompt, params, **kwargs)
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.request_id == request_id and out.token is not None:
                tokens.append(out.token)
                logits.append(out.logits)
    return tokens, logits, admission


@pytest.mark.parametrize(
    "length, cached", [(48, 32), (53, 48)], ids=["full-blocks", "partial-last-block"]
)
def test_prefix_hit_equals_cold_run(make_engine, prompt, length, cached):
    text = prompt(length)
    cold_tokens, cold_logits, cold = run(make_engine(), "cold", text, GREEDY)
    assert cold.num_cached_tokens == 0

    warm = make_engine()
    run(
        warm,
        "first",
        text[:length] + prompt(7, seed=9),
        SamplingParams(max_tokens=2, temperature=0.0),
    )
    tokens, logits, admission = run(warm, "again", text, GREEDY)
    # A hit covers whole cached blocks only, capped so the last prompt token is computed.
    assert admission.num_cached_tokens == cached
    assert tokens == cold_tokens
    for got, want in zip(logits, cold_logits, strict=True):
        assert_logits_close(got, want)


def test_prefix_hit_skips_computation(make_engine, prompt):
    engine = make_engine()
    text = prompt(70)
    run(engine, "a", text, SamplingParams(max_tokens=1, temperature=0.0))
    before = engine.stats().computed_tokens
    run(engine, "b", text + prompt(5, seed=3), SamplingParams(max_tokens=1, temperature=0.0))
    # 64 of 75 tokens come from 4 cached blocks; only 11 are computed.
    assert engine.stats().computed_tokens - before == 75 - 64
    assert engine.stats().cache.hits == 4


@pytest.mark.parametrize("length, chunk", [(150, 7), (300, 29)])
def test_chunked_prefill_equals_one_shot(make_engine, prompt, length, chunk):
    # 300 tokens in one shot run attention as two query tiles (256 + 44): tiles must not matter.
    assert query_tile(300, 8) < 300
    text = prompt(length, seed=1)
    whole_tokens, whole_logits, _ = run(make_engine(max_num_batched_tokens=512), "r", text, GREEDY)
    chunked = make_engine(max_num_batched_tokens=chunk)
    chunked.add_request("r", text, GREEDY)
    steps_to_first = 0
    first = None
    while first is None:
        steps_to_first += 1
        first = chunked.step().outputs[0]
        first = first if first.token is not None else None
    assert steps_to_first == -(-length // chunk)
    assert first.token == whole_tokens[0]
    assert_logits_close(first.logits, whole_logits[0])
    rest = []
    while chunked.has_unfinished():
        rest += [o.token for o in chunked.step().outputs]
    assert [first.token, *rest] == whole_tokens


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded-top-p"])
def test_batched_decode_equals_one_by_one(make_engine, prompt, params):
    prompts = [prompt(n, seed=n) for n in (5, 17, 33, 60, 91)]
    alone = [run(make_engine(), f"r{i}", p, params) for i, p in enumerate(prompts)]

    engine = make_engine()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    logits: dict[str, list[np.ndarray]] = {f"r{i}": [] for i in range(len(prompts))}
    batch_sizes = []
    while engine.has_unfinished():
        result = engine.step()
        batch_sizes.append(result.num_seqs)
        for out in result.outputs:
            if out.token is not None:
                tokens[out.request_id].append(out.token)
                logits[out.request_id].append(out.logits)
    assert max(batch_sizes) == len(prompts)  # really decoded as one batch
    for i, (want_tokens, want_logits, _) in enumerate(alone):
        assert tokens[f"r{i}"] == want_tokens
        for got, want in zip(logits[f"r{i}"], want_logits, strict=True):
            assert_logits_close(got, want)


def test_serialized_kv_continues_identically(make_engine, prompt):
    """P->D hand-off: prefill on one engine, ship the blocks as bytes, decode on another."""
    text = prompt(75, seed=4)
    cold_tokens, cold_logits, _ = run(make_engine(), "cold", text, SEEDED)

    prefill = make_engine()
    (first,), _, _ = run(
        prefill, "p", text, SamplingParams(max_tokens=1, temperature=0.9, top_p=0.9, seed=1234)
    )
    blocks = prefill.export_prefix(text)
    assert len(blocks) == 75 // 16 and all(isinstance(b, bytes) for _, b in blocks)

    decode = make_engine()
    tokens, logits, admission = run(decode, "d", text, SEEDED, output_ids=[first], kv_blocks=blocks)
    assert admission.num_imported_blocks == 4 and admission.num_cached_tokens == 64
    assert [first, *tokens] == cold_tokens
    for got, want in zip(logits, cold_logits[1:], strict=True):
        assert_logits_close(got, want)
    assert decode.stats().computed_tokens == 76 - 64 + len(tokens) - 1


def test_import_skips_blocks_already_cached(make_engine, prompt):
    text = prompt(40, seed=5)
    source = make_engine()
    run(source, "a", text, SamplingParams(max_tokens=1))
    blocks = source.export_prefix(text)
    target = make_engine()
    run(target, "a", text[:20], SamplingParams(max_tokens=1))  # caches block 0 locally
    admission = target.add_request("b", text, SamplingParams(max_tokens=1), kv_blocks=blocks)
    assert admission.num_imported_blocks == 1 and admission.num_cached_tokens == 32


def test_events_and_lookup(make_engine, prompt):
    engine = make_engine()
    text = prompt(40, seed=6)
    assert engine.cached_prefix_tokens(text) == 0
    run(engine, "a", text, SamplingParams(max_tokens=1))
    assert engine.cached_prefix_tokens(text) == 32
    events = engine.drain_events()
    assert [e.kind for e in events] == ["stored", "stored"]
    assert events[0].parent_hash is None and events[1].parent_hash == events[0].block_hashes[0]
    assert [e.seq for e in events] == [1, 2] and engine.drain_events() == []


def test_step_reports_batch_composition_and_load(make_engine, prompt):
    engine = make_engine(max_num_batched_tokens=40)
    engine.add_request("a", prompt(30), SamplingParams(max_tokens=3))
    engine.add_request("b", prompt(50, seed=2), SamplingParams(max_tokens=3))
    assert engine.load().pending_prefill_tokens == 80
    first = engine.step()  # a: whole prompt (30), b: first 10 tokens of its prompt
    assert (first.new_tokens, first.context_before) == ((30, 10), (0, 0))
    assert engine.load().num_decoding == 1 and engine.load().pending_prefill_tokens == 40
    second = engine.step()  # a decodes first, then b continues its prefill
    assert (second.new_tokens, second.context_before) == ((1, 39), (30, 10))
    batch = second.rank_batch()
    assert batch.new_tokens.tolist() == [1, 39] and batch.cached_tokens.tolist() == [30, 10]
    assert (second.num_decode_tokens, second.num_prefill_tokens) == (1, 39)


def test_finishes_on_length_and_releases_blocks(make_engine, prompt):
    engine = make_engine(num_blocks=16)
    tokens, _, _ = run(engine, "a", prompt(30), SamplingParams(max_tokens=5, temperature=0.0))
    assert len(tokens) == 5
    assert not engine.has_unfinished() and engine.cache.num_free == 16


def test_request_that_cannot_fit_the_cache_alone_is_refused(make_engine, prompt):
    engine = make_engine(num_blocks=2)
    with pytest.raises(ValueError, match="prompt_ids: .* need 7 KV blocks; the cache has 2"):
        engine.add_request("a", prompt(100), GREEDY)


def test_full_queue_pushes_back(make_engine):
    engine = make_engine(max_queue=2)
    engine.add_request("a", [1, 2, 3], GREEDY)
    engine.add_request("b", [1, 2, 3], GREEDY)
    with pytest.raises(QueueFull):
        engine.add_request("c", [1, 2, 3], GREEDY)
    assert engine.num_requests == 2


@pytest.mark.parametrize(
    "prompt_ids, params, kwargs, field",
    [
        ([], GREEDY, {}, "prompt_ids"),
        ([1] * 512, GREEDY, {}, "prompt_ids"),
        ([1, 264], GREEDY, {}, "prompt_ids"),
        ([1, -1], GREEDY, {}, "prompt_ids"),
        ([1, 2], SamplingParams(max_tokens=2), {"output_ids": [3, 4]}, "output_ids"),
        ([1] * 20, GREEDY, {"kv_blocks": [(123, b"")]}, "kv_blocks"),
        ([1] * 20, GREEDY, {"kv_blocks": [(1, b""), (2, b"")]}, "kv_blocks"),
    ],
)
def test_bad_requests_name_the_parameter(make_engine, prompt_ids, params, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_engine().add_request("r", prompt_ids, params, **kwargs)


def test_duplicate_and_unknown_request_ids(make_engine):
    engine = make_engine()
    engine.add_request("r", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("r", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="request_id"):
        engine.free("nope")
    engine.free("r")
    assert engine.cache.num_free == engine.cache.num_blocks


def test_bad_kv_block_changes_nothing(make_engine, prompt, cfg):
    text = prompt(40, seed=8)
    source = make_engine()
    run(source, "a", text, SamplingParams(max_tokens=1))
    (good, (second_hash, second_bytes)) = source.export_prefix(text)
    engine = make_engine()
    with pytest.raises(ValueError, match=r"kv_blocks\[1\]: kv block: payload"):
        engine.add_request("b", text, GREEDY, kv_blocks=[good, (second_hash, second_bytes[:-8])])
    assert engine.cache.num_free == engine.cache.num_blocks
    assert engine.cache.stats().num_cached == 0 and engine.num_requests == 0


def test_from_deployment_uses_the_config_sections():
    from rackserve.config import Config, EngineSection, EngramSection

    config = Config(
        engine=EngineSection(block_size=8, cache_blocks_per_rank=64, prefill_chunk_tokens=32),
        engram=EngramSection(table_rows=4096),
    )
    engine = Engine.from_deployment(config)
    assert (engine.cfg.block_size, engine.cfg.engram_rows) == (8, 4096)
    assert (engine.cache.num_blocks, engine.chunk_tokens) == (64, 32)  # the old name still loads
    assert engine.scheduler.limits.max_num_seqs == 1024  # vLLM's default
    assert engine.add_request("r", [1] * 20, GREEDY).num_cached_tokens == 0


def _three_rounds_of_64(engine: Engine, prompt) -> dict[str, list[int]]:
    """3 rounds of 64 concurrent requests, each round arriving while the previous one runs."""
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for step in range(10**6):
        if step % 4 == 0 and step // 4 < 3:
            for i in range(64):
                rid = f"round{step // 4}-{i}"
                engine.add_request(rid, prompt(20 + (i * 7) % 45, seed=step * 100 + i), params)
                tokens[rid] = []
        if not engine.has_unfinished():
            return tokens
        for out in engine.step().outputs:  # never raises for lack of KV
            if out.token is not None:
                tokens[out.request_id].append(out.token)
    raise AssertionError("did not finish")


def test_kv_starved_engine_completes_3x64_requests_identically(make_engine, prompt):
    roomy = make_engine(num_blocks=4096)
    want = _three_rounds_of_64(roomy, prompt)
    assert roomy.stats().num_preemptions == 0
    starved = make_engine(num_blocks=48)  # 64 requests need ~200 blocks; one needs at most 5
    got = _three_rounds_of_64(starved, prompt)
    assert starved.stats().num_preemptions > 0
    assert len(got) == 192 and all(len(t) == 8 for t in got.values())
    assert got == want
    assert starved.cache.num_free == 48
