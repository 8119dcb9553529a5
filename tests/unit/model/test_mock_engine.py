"""The mock engine keeps the real engine's bookkeeping: on the same requests it schedules the same
steps, reuses the same prefixes, imports the same blocks and publishes the same KV events; only
the tokens differ (deterministic pseudo-tokens, identical after a P->D hand-off)."""

from __future__ import annotations

import pytest

from rackserve.config import Config
from rackserve.kv.events import Publisher
from rackserve.model.config import ModelConfig
from rackserve.model.engine import Engine
from rackserve.model.mock_engine import MockEngine, mock_model_config
from rackserve.model.sampling import SamplingParams
from rackserve.model.tokenizer import EOS

MODEL = ModelConfig()
BLOCK_BYTES = 16 * 890  # deepseek-v4.1-flash: 890 bytes of KV per token
LIMITS = {"max_num_batched_tokens": 64, "max_num_seqs": 4}


def real(num_blocks: int) -> Engine:
    return Engine.from_config(MODEL, num_blocks=num_blocks, publisher=Publisher("p", 0), **LIMITS)


def mock(num_blocks: int, block_bytes: int = BLOCK_BYTES) -> MockEngine:
    return MockEngine(mock_model_config(MODEL), num_blocks, block_bytes,
                      publisher=Publisher("p", 0), **LIMITS)


def params(n: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def workload() -> list[tuple[str, list[int], SamplingParams]]:
    """Shared prefixes, partial blocks, chunked prefill and more blocks than the cache holds."""
    system = [t % 250 + 1 for t in range(70)]
    return [
        ("a", system + [7, 8, 9], params(6)),
        ("b", system + [10] * 21, params(5)),
        ("c", [t % 97 + 3 for t in range(130)], params(4)),
        ("d", system + [7, 8, 9] + [11] * 17, params(3)),
        ("e", [t % 61 + 5 for t in range(40)], params(8)),
    ]


def trace(engine: Engine, waves: list[list[tuple[str, list[int], SamplingParams]]]) -> dict:
    """Everything but the tokens: admissions, each step's schedule, outputs' counts, events."""
    admissions, steps, finished, events = [], [], {}, []
    for wave in waves:
        for rid, prompt, p in wave:
            admissions.append(engine.add_request(rid, prompt, p))
        while engine.has_unfinished():
            result = engine.step()
            steps.append((result.schedule.new_tokens, result.context_before,
                          result.schedule.preempted, result.num_prefill_tokens))
            for o in result.outputs:
                assert o.token != EOS
                if o.finished:
                    finished[o.request_id] = (o.finish_reason, o.num_cached_tokens, o.num_output_tokens)
            events += [(e.kind, e.block_hashes) for e in engine.drain_events()]
    return {"admissions": admissions, "steps": steps, "finished": finished, "events": events,
            "stats": engine.stats()}


@pytest.mark.parametrize("num_blocks", [64, 12], ids=["roomy", "evicting-and-preempting"])
def test_same_requests_same_bookkeeping(num_blocks: int) -> None:
    jobs = workload()
    waves = [jobs, jobs[:1] + jobs[3:4]]  # the second wave hits what the first cached
    want, got = trace(real(num_blocks), waves), trace(mock(num_blocks), waves)
    assert got == want
    assert any(a.num_cached_tokens for a in want["admissions"])  # prefix hits were exercised
    if num_blocks == 12:  # and so were eviction and preemption
        assert want["stats"].num_preemptions and want["stats"].cache.evictions


def test_pseudo_tokens_survive_the_hand_off_and_are_deterministic() -> None:
    """Prefill (max_tokens 1) exports its blocks; a decode rank imports them and continues with
    exactly the tokens of one cold run, importing what the real engine would import."""
    prompt = [t % 200 + 1 for t in range(83)]  # 5 full blocks + 3 tokens
    whole = mock(64).generate([("r", prompt, params(6))])["r"]
    assert whole == mock(64).generate([("r", prompt, params(6))])["r"]
    assert set(whole) <= set(b"abcdefghijklmnopqrstuvwxyz ")

    prefill = mock(64)
    first = prefill.generate([("r", prompt, params(1))])["r"]
    blocks = prefill.export_prefix(prompt)
    assert [len(b) for _, b in blocks] == [BLOCK_BYTES] * 5
    decode = mock(64)
    admission = decode.add_request("r", prompt, params(6), output_ids=first, kv_blocks=blocks)
    rest = []
    while decode.has_unfinished():
        result = decode.step()
        rest += [o.token for o in result.outputs if o.token is not None]
    assert first + rest == whole

    real_prefill, real_decode = real(64), real(64)
    real_first = real_prefill.generate([("r", prompt, params(1))])["r"]
    real_admission = real_decode.add_request("r", prompt, params(6), output_ids=real_first,
                                             kv_blocks=real_prefill.export_prefix(prompt))
    assert [h for h, _ in blocks] == [h for h, _ in real_prefill.export_prefix(prompt)]
    assert (admission.num_cached_tokens, admission.num_imported_blocks) == (
        real_admission.num_cached_tokens, real_admission.num_imported_blocks)


def test_pool_bytes_sized_like_the_target_or_none() -> None:
    cfg = Config()
    assert MockEngine.from_deployment(cfg).pool_block_bytes == BLOCK_BYTES
    none = cfg.model_copy(update={"pool": cfg.pool.model_copy(update={"mock_bytes": False})})
    engine = MockEngine.from_deployment(none)
    prompt = list(range(1, 40))
    engine.generate([("r", prompt, params(1))])
    assert [b for _, b in engine.export_prefix(prompt)] == [b"", b""]
    with pytest.raises(ValueError, match="kv_blocks\\[0\\]: 3 bytes"):
        mock(64).add_request("x", prompt, params(2), kv_blocks=[(engine.export_prefix(prompt)[0][0], b"abc")])
