"""Each sampling parameter through the live cluster (prefill on one rank, decode on another) gives
the tokens the small model gives with the same settings in-process: logit_bias, min_tokens, the
three penalties, seeds, echo's prompt logprobs, and n > 1 streams interleaved."""

from __future__ import annotations

import itertools
import json

import httpx
import numpy as np
import pytest

from rackserve.config import load_config
from rackserve.model.engine import Engine
from rackserve.model.logprobs import log_softmax
from rackserve.model.sampling import SamplingParams
from rackserve.model.tokenizer import EOS
from services.launcher import DEFAULT_CONFIG

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
_IDS = itertools.count()
CYCLING = np.random.default_rng(4).integers(0, 256, 20).tolist()  # greedy: ",by,by..."


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_deployment(load_config(DEFAULT_CONFIG))


def local(engine: Engine, prompt: list[int], **params) -> list[int]:
    request_id = f"local-{next(_IDS)}"
    return engine.generate([(request_id, prompt, SamplingParams(**params))])[request_id]


def complete(base: str, **fields) -> dict:
    body = {"model": MODEL, "prompt": CYCLING, "return_token_ids": True, **fields}
    reply = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize(
    "shaping",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 1.8},
        {"logit_bias": {"81": 100}},
        {"logit_bias": {str(EOS): 100}, "min_tokens": 3},
    ],
    ids=["frequency", "presence", "repetition", "logit-bias", "min-tokens"],
)
def test_the_cluster_samples_what_the_model_does(live_cluster, engine, shaping) -> None:
    plain = complete(live_cluster.base_url, max_tokens=16, temperature=0)["choices"][0]
    got = complete(live_cluster.base_url, max_tokens=16, temperature=0, **shaping)["choices"][0]
    bias = tuple((int(k), float(v)) for k, v in shaping.get("logit_bias", {}).items())
    want = local(engine, CYCLING, max_tokens=16, temperature=0.0,
                 **{**shaping, "logit_bias": bias})
    assert got["token_ids"] == want != plain["token_ids"]
    if "min_tokens" in shaping:
        assert want[3] == EOS and len(want) == 4 and got["finish_reason"] == "stop"


def test_seeded_repeats_and_unseeded_differs(live_cluster) -> None:
    base = live_cluster.base_url
    seeded = [complete(base, max_tokens=24, temperature=1.0, seed=5)["choices"][0]["token_ids"]
              for _ in range(2)]
    fresh = [complete(base, max_tokens=24, temperature=1.0)["choices"][0]["token_ids"]
             for _ in range(2)]
    assert seeded[0] == seeded[1]
    assert fresh[0] != fresh[1]


def test_echo_logprobs_are_the_models_prompt_logprobs(live_cluster, engine) -> None:
    prompt = "The rack"
    ids = list(prompt.encode())
    reply = complete(live_cluster.base_url, prompt=prompt, max_tokens=1, temperature=0, echo=True,
                     logprobs=2)
    lp = reply["choices"][0]["logprobs"]
    assert lp["tokens"][: len(ids)] == list(prompt) and lp["token_logprobs"][0] is None
    for i in range(1, len(ids)):
        engine.add_request(f"echo{i}", ids[:i], SamplingParams(max_tokens=1, temperature=0.0))
        (out,) = [o for o in engine.step().outputs if o.request_id == f"echo{i}"]
        want = float(log_softmax(out.logits)[ids[i]])
        assert lp["token_logprobs"][i] == pytest.approx(want, abs=1e-3)
        assert len(lp["top_logprobs"][i]) >= 2


def test_n_choices_stream_interleaved(live_cluster) -> None:
    body = {"model": MODEL, "prompt": "The rack", "max_tokens": 6, "n": 2, "stream": True,
            "ignore_eos": True, "temperature": 1.0, "seed": 3}
    reply = httpx.post(f"{live_cluster.base_url}/v1/completions", json=body, timeout=60)
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    order = [c["choices"][0]["index"] for c in chunks if c["choices"]]
    assert order[:2] == [0, 1] and order.index(1) < len(order) - order[::-1].index(0) - 1
