"""logit_bias, min_tokens and the frequency, presence and repetition penalties on the small
model's real logits: each step's draw checked against a reference written here from the API
definitions, the effect on the output shown, and the same result after a P->D hand-off."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.model.engine import Engine
from rackserve.model.logits_processors import process_logits
from rackserve.model.sampling import SamplingParams
from rackserve.model.tokenizer import EOS

REPEATING = 2  # prompt(20, seed=2): greedy output settles into one token repeated ("wwww...")
CYCLING = 4  # prompt(20, seed=4): greedy output cycles through a few tokens (",by,by")


def reference(raw: np.ndarray, params: SamplingParams, prompt: list[int], outputs: list[int]):
    """The API definitions, one token at a time: OpenAI's logit_bias and frequency / presence
    penalties (over generated tokens), vLLM's min_tokens (EOS banned) and repetition_penalty
    (tokens of prompt or output: a positive logit divided, a negative one multiplied)."""
    z = [float(v) for v in raw]
    for token, bias in params.logit_bias:
        z[token] += bias
    if len(outputs) < params.min_tokens:
        z[EOS] = float("-inf")
    for j in set(prompt) | set(outputs):
        r = params.repetition_penalty
        z[j] = z[j] / r if z[j] > 0 else z[j] * r
    for j in set(outputs):
        c = outputs.count(j)
        z[j] -= c * params.frequency_penalty + params.presence_penalty
    return np.array(z)


def steps(engine: Engine, prompt: list[int], params: SamplingParams, request_id: str = "r",
          output_ids: tuple[int, ...] = ()):
    """(token, raw logits, finish_reason) of every token the request samples on `engine`."""
    engine.add_request(request_id, prompt, params, output_ids=output_ids)
    out = []
    while engine.has_unfinished():
        for o in engine.step().outputs:
            if o.token is not None:
                out.append((o.token, o.logits, o.finish_reason))
    return out


def assert_each_draw_is_the_reference_argmax(prompt, params, taken, given=()):
    outputs = list(given)
    for token, raw, _ in taken:
        expected = reference(raw, params, prompt, outputs)
        assert token == int(np.argmax(expected))
        outputs.append(token)


def test_process_logits_equals_the_reference_on_real_logits(make_engine, prompt):
    text = prompt(20, seed=REPEATING)
    taken = steps(make_engine(), text, SamplingParams(max_tokens=8, temperature=0.0))
    raw, outputs = taken[-1][1], [t for t, _, _ in taken[:-1]]
    params = SamplingParams(
        max_tokens=16, temperature=0.0, logit_bias=((5, 3.5), (outputs[0], -7.0)), min_tokens=12,
        frequency_penalty=0.7, presence_penalty=-0.4, repetition_penalty=1.3,
    )
    got = process_logits(raw, params, text, outputs, (EOS,))
    want = reference(raw, params, text, outputs)
    assert got[EOS] == -np.inf
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(got[np.isfinite(got)], np.asarray(raw, np.float64)[np.isfinite(got)])


@pytest.mark.parametrize(
    "shaping",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 1.8},
        {"frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.2},
    ],
    ids=["frequency", "presence", "repetition", "all-three"],
)
def test_penalties_break_a_repeating_output(make_engine, prompt, shaping):
    text = prompt(20, seed=CYCLING)
    plain = [t for t, _, _ in steps(make_engine(), text, SamplingParams(max_tokens=24, temperature=0))]
    params = SamplingParams(max_tokens=24, temperature=0.0, **shaping)
    taken = steps(make_engine(), text, params)
    assert_each_draw_is_the_reference_argmax(text, params, taken)
    tokens = [t for t, _, _ in taken]
    assert len(set(plain)) <= 13  # the plain run cycles through a few tokens
    assert len(set(tokens)) >= len(set(plain)) + 4


def test_presence_is_paid_once_so_a_strong_repeat_can_outbid_it(make_engine, prompt):
    """presence_penalty 2.0 leaves "wwww..." as it is: the repeated token leads the next one by
    more than 2 logits. It is applied all the same (every draw is the reference's), and frequency
    2.0, paid per repeat, does break it."""
    text = prompt(20, seed=REPEATING)
    plain = [t for t, _, _ in steps(make_engine(), text, SamplingParams(max_tokens=24, temperature=0))]
    presence = SamplingParams(max_tokens=24, temperature=0.0, presence_penalty=2.0)
    taken = steps(make_engine(), text, presence)
    assert_each_draw_is_the_reference_argmax(text, presence, taken)
    assert [t for t, _, _ in taken] == plain and plain.count(plain[-1]) >= 15
    frequency = SamplingParams(max_tokens=24, temperature=0.0, frequency_penalty=2.0)
    broken = [t for t, _, _ in steps(make_engine(), text, frequency)]
    assert broken.count(plain[-1]) <= 3


def test_negative_penalties_favour_repeats(make_engine, prompt):
    text = prompt(20, seed=0)
    plain = [t for t, _, _ in steps(make_engine(), text, SamplingParams(max_tokens=24, temperature=0))]
    params = SamplingParams(max_tokens=24, temperature=0.0, presence_penalty=-2.0, frequency_penalty=-1.0)
    taken = steps(make_engine(), text, params)
    assert_each_draw_is_the_reference_argmax(text, params, taken)
    assert len({t for t, _, _ in taken}) < len(set(plain))


def test_logit_bias_forces_and_bans(make_engine, prompt):
    text = prompt(20, seed=3)
    plain = [t for t, _, _ in steps(make_engine(), text, SamplingParams(max_tokens=10, temperature=0))]
    forced = steps(make_engine(), text, SamplingParams(max_tokens=10, temperature=0.0,
                                                      logit_bias=((ord("Q"), 100.0),)))
    assert [t for t, _, _ in forced] == [ord("Q")] * 10
    ban = tuple((t, -100.0) for t in set(plain))
    banned = SamplingParams(max_tokens=10, temperature=0.0, logit_bias=ban)
    taken = steps(make_engine(), text, banned)
    assert not {t for t, _, _ in taken} & set(plain)
    assert_each_draw_is_the_reference_argmax(text, banned, taken)
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=9, logit_bias=((ord("Q"), 100.0),))
    assert [t for t, _, _ in steps(make_engine(), text, sampled)] == [ord("Q")] * 10


def test_min_tokens_bans_eos_until_reached(make_engine, prompt):
    text = prompt(20, seed=3)
    eos_first = SamplingParams(max_tokens=10, temperature=0.0, logit_bias=((EOS, 100.0),))
    assert [(t, f) for t, _, f in steps(make_engine(), text, eos_first)] == [(EOS, "stop")]
    params = SamplingParams(max_tokens=10, temperature=0.0, logit_bias=((EOS, 100.0),), min_tokens=4)
    taken = steps(make_engine(), text, params)
    assert [t == EOS for t, _, _ in taken] == [False] * 4 + [True]
    assert taken[-1][2] == "stop"
    assert_each_draw_is_the_reference_argmax(text, params, taken)
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=3, min_tokens=4,
                            logit_bias=((EOS, 100.0),))
    assert [t == EOS for t, _, _ in steps(make_engine(), text, seeded)] == [False] * 4 + [True]


def test_shaping_survives_the_p_to_d_hand_off(make_engine, prompt):
    """The prefill rank samples token 1 and the decode rank the rest, from the same settings: the
    decode rank counts the prefill's token as an output (penalties, min_tokens)."""
    text = prompt(20, seed=REPEATING)
    shaping = {"frequency_penalty": 1.5, "repetition_penalty": 1.3, "min_tokens": 3,
               "logit_bias": ((EOS, 60.0),)}
    params = SamplingParams(max_tokens=16, temperature=0.0, **shaping)
    whole = steps(make_engine(), text, params)
    (first, _, _), = steps(make_engine(), text, SamplingParams(max_tokens=1, temperature=0.0, **shaping))
    rest = steps(make_engine(), text, params, output_ids=(first,))
    assert [first, *(t for t, _, _ in rest)] == [t for t, _, _ in whole]
    assert_each_draw_is_the_reference_argmax(text, params, rest, given=(first,))
    assert [t for t, _, _ in whole][3] == EOS  # min_tokens held EOS back for three tokens


def test_prompt_logits_are_each_prefix_s_next_token_logits(make_engine, prompt, cfg):
    """prompt_logprobs: row p holds the logits after the prompt's first p + 1 tokens, even when the
    prompt is cached (every token is computed again) or prefilled in chunks."""
    text = prompt(40, seed=6)
    engine = make_engine(max_num_batched_tokens=16)
    steps(engine, text, SamplingParams(max_tokens=1, temperature=0.0), "warm")  # now cached
    engine.add_request("p", text, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0))
    got = None
    while engine.has_unfinished():
        for o in engine.step().outputs:
            if o.prompt_logits is not None:
                got = o.prompt_logits
    assert got is not None and got.shape == (len(text), cfg.vocab_size)
    for k in (1, 2, 17, 39, 40):
        (_, want, _), = steps(make_engine(), text[:k], SamplingParams(max_tokens=1, temperature=0))
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got[k - 1], want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((3, float("inf")),)}, "logit_bias"),
    ],
)
def test_bad_shaping_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_logit_bias_outside_the_vocabulary_is_refused(make_engine, cfg):
    with pytest.raises(ValueError, match="logit_bias"):
        make_engine().add_request("r", [1, 2], SamplingParams(logit_bias=((cfg.vocab_size, 1.0),)))
