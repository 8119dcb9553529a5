"""Pure pieces of the live services: pacing arithmetic, incremental detokenization, topology names."""

from __future__ import annotations

from rackserve.config import load_config
from rackserve.model import tokenizer
from services.launcher import DEFAULT_CONFIG
from services.pacing import pace
from services.router.detok import Detokenizer
from services.topology import instances


def test_pace_sleeps_out_the_budget_or_counts_the_overrun() -> None:
    on_time = pace(sim_s=0.5, time_scale=0.1, compute_s=0.02)
    assert abs(on_time.sleep_s - 0.03) < 1e-12 and on_time.lag_s == 0.0
    late = pace(sim_s=0.5, time_scale=0.1, compute_s=0.08)
    assert late.sleep_s == 0.0 and abs(late.lag_s - 0.03) < 1e-12
    assert pace(sim_s=0.5, time_scale=0.0, compute_s=9.0) == pace(1.0, 0.0, 0.0)  # unpaced: no lag


def feed(detok: Detokenizer, text: str) -> str:
    out = ""
    for token in tokenizer.encode(text):
        out += detok.push([token])
        if detok.stopped:
            return out
    return out + detok.flush()


def test_detokenizer_holds_cut_characters_and_stops_before_a_stop_string() -> None:
    text = "naïve café — ok"
    detok = Detokenizer()
    pieces = [detok.push([t]) for t in tokenizer.encode(text)]
    assert "".join(pieces) + detok.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    stopped = Detokenizer(["END"])
    assert feed(stopped, "first part END second part") == "first part "
    assert stopped.stopped
    assert feed(Detokenizer(["ENDS"]), "no END here") == "no END here"


def test_topology_names_every_rank_of_the_default_scenario() -> None:
    cfg = load_config(DEFAULT_CONFIG)
    prefill, decode = instances(cfg, "prefill"), instances(cfg, "decode")
    assert [(i.name, i.dp_ranks, i.gpus) for i in prefill] == [("prefill-dep2-0", 2, 2)]
    assert [(i.name, i.dp_ranks, i.gpus) for i in decode] == [
        ("decode-wide-ep-0", 4, 4),
        ("decode-tp8-0", 1, 8),
    ]
