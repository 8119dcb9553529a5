"""The step store (rackserve/sim/step_store.py): priced steps kept on disk for the next run of the
same cost model, the same figures with fewer prices computed; files that are not ours are skipped."""

from __future__ import annotations

import json
import os
import pickle

import pytest
from typer.testing import CliRunner

from rackserve.cli import app
from rackserve.sim import run as sim_run
from rackserve.sim import step_store
from rackserve.sim.run import keep_steps, run_policies, shared_timing, store_key, timing_for
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.step_store import ENV, StepStore

TIMING = {"hardware": "vr200", "model": "deepseek-v4.1-flash", "optimizations": "rubin-optimized",
          "target_block_tokens": 64}


def lazy_agentx(optimizations: str = "rubin-optimized", limit: int = 12):
    """A small AgentX run whose decode is the lazy batch: decode steps, tail ratios, their plain steps and
    the router's prefill estimates all go through the memo."""
    return scenario_from_dict({
        "name": "store", "timing": {**TIMING, "optimizations": optimizations},
        "deployment": {"prefill": [{"layout": "dep2", "count": 2}], "decode": [{"layout": "wide-ep", "ranks": 8, "count": 1}]},
        "routing": {"policy": "least-uncached-work", "seed": 0},
        "pool": {"hbm_capacity_bytes": 3_000_000_000, "dram_capacity_bytes": 6_000_000_000},
        "sim": {"kv_block_multiple": 16, "rank_cache_tokens": 600_000},
        "workload": {"kind": "agentx-trace", "seed": 0, "limit": limit, "concurrency": 12, "duration_s": 25.0,
                     "measure_start_s": 5.0}})


def figures(sc, timing) -> list[dict]:
    out = [r.to_dict(samples=True) for r in run_policies(sc, ["least-uncached-work"], timing=timing)]
    for r in out:
        for k in ("wall_s", "cpu_s"):
            r.pop(k, None)
    return json.loads(json.dumps(out))


def test_a_later_run_reads_the_stored_steps_prices_none_and_gives_the_same_figures(tmp_path):
    sc = lazy_agentx()
    first = timing_for(sc)
    want = figures(sc, first)
    assert first.misses > 0
    tables = first.entries()
    assert all(tables[name] for name in ("steps", "estimates", "ratios", "plains"))  # every table is exercised
    store = StepStore(tmp_path)
    key = store_key(sc, first)
    written = store.save(first, key)
    assert written == sum(len(t) for t in tables.values())

    later = timing_for(sc)  # as a new process would: an empty memo
    assert store.load(later, key) == written
    assert figures(sc, later) == want
    assert later.misses == 0  # every price came from the store


def test_the_store_file_is_the_cost_models_own(tmp_path, monkeypatch):
    sc, other = lazy_agentx(), lazy_agentx("baseline")
    t = timing_for(sc)
    figures(sc, t)
    store = StepStore(tmp_path)
    key = store_key(sc, t)
    store.save(t, key)
    t_other = timing_for(other)
    other_key = store_key(other, t_other)
    assert other_key != key and store.load(t_other, other_key) == 0  # other optimizations: other prices
    monkeypatch.setattr(step_store, "_code_hash", "a changed timing model")
    assert store_key(sc, t) != key  # a code change starts a new file


def test_a_file_that_is_not_a_step_store_is_skipped_and_nothing_in_it_runs(tmp_path, caplog):
    sc = lazy_agentx()
    t = timing_for(sc)
    store = StepStore(tmp_path)
    key = store_key(sc, t)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    store.path(key).write_bytes(pickle.dumps({"format": 1, "key": key, "entries": {"steps": {"k": Payload()}}}))
    assert store.load(t, key) == 0
    assert not marker.exists() and "skipped" in caplog.text and "system" in caplog.text
    store.path(key).write_bytes(b"\x80\x05 not a pickle")  # damaged
    assert store.load(t, key) == 0
    figures(sc, t)
    store.save(t, key)  # replaces it
    assert store.load(timing_for(sc), key) == sum(len(x) for x in t.entries().values())
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        StepStore(a_file)


def test_saves_merge_what_each_run_priced(tmp_path):
    small, large = lazy_agentx(limit=6), lazy_agentx(limit=12)
    a, b = timing_for(small), timing_for(large)
    figures(small, a)
    figures(large, b)
    store = StepStore(tmp_path)
    key = store_key(small, a)
    assert key == store_key(large, b)  # the same cost model: one file
    store.save(a, key)
    store.save(b, key)
    union = {name: set(a.entries()[name]) | set(b.entries()[name]) for name in a.entries()}
    fresh = timing_for(small)
    assert store.load(fresh, key) == sum(len(s) for s in union.values())
    assert {name: set(t) for name, t in fresh.entries().items()} == union


def test_shared_timing_loads_from_the_environments_store_and_keep_steps_writes_it(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "steps"))
    monkeypatch.setattr(sim_run, "_TIMINGS", {})
    sc = lazy_agentx()
    t = shared_timing(sc)
    want = figures(sc, t)
    keep_steps(sc, t)
    files = list((tmp_path / "steps").glob("steps-*.pkl"))
    assert len(files) == 1
    before = files[0].stat().st_mtime_ns
    keep_steps(sc, t)  # nothing priced since: not written again
    assert files[0].stat().st_mtime_ns == before
    monkeypatch.setattr(sim_run, "_TIMINGS", {})  # a new process
    t2 = shared_timing(sc)
    assert len(t2.entries()["steps"]) == len(t.entries()["steps"])
    assert figures(sc, t2) == want and t2.misses == 0




def test_sim_step_store_option(tmp_path, monkeypatch, tiny_yaml):
    monkeypatch.setattr(sim_run, "_TIMINGS", {})
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_yaml)
    steps = tmp_path / "steps"
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out"), "--step-store", str(steps)])
    assert res.exit_code == 0, res.output
    assert len(list(steps.glob("steps-*.pkl"))) == 1
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(sim_run, "_TIMINGS", {})  # each command is a process of its own
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out2")])  # default: OUT/step-store
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "out2" / "step-store").glob("steps-*.pkl"))) == 1
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(sim_run, "_TIMINGS", {})
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out3"), "--no-step-store"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "out3" / "step-store").exists() and ENV not in os.environ
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out"), "--step-store", str(path)])
    flat = "".join(ch for ch in res.output if not ch.isspace() and ch != "│")  # rich wraps a long path
    assert res.exit_code == 2 and "--step-store:" in flat and "isnotadirectory" in flat


def test_workers_of_a_search_take_what_the_others_stored_since_they_looked(tmp_path, monkeypatch):
    small, large = lazy_agentx(limit=6), lazy_agentx(limit=12)
    a, b = timing_for(small), timing_for(large)  # two workers' memos, one cost model
    store = StepStore(tmp_path)
    key = store_key(small, a)
    assert store.refresh(a, key) == 0 and store.refresh(b, key) == 0  # nothing stored yet
    figures(small, a)
    store.save(a, key)
    reads = []
    real_read = step_store._read
    monkeypatch.setattr(step_store, "_read", lambda *args: reads.append(args) or real_read(*args))
    assert store.refresh(a, key) == 0 and not reads  # its own save: the file is not read again
    assert store.refresh(b, key) == sum(len(t) for t in a.entries().values()) and len(reads) == 1
    figures(large, b)  # prices only what a did not
    store.save(b, key)
    assert store.refresh(a, key) > 0
    assert {n: set(t) for n, t in a.entries().items()} == {n: set(t) for n, t in b.entries().items()}
    c = timing_for(small)  # a worker that saves without having looked: it takes the file's entries as it writes
    figures(small, c)
    store.save(c, key)
    assert store.refresh(c, key) == 0
    assert {n: set(t) for n, t in c.entries().items()} == {n: set(t) for n, t in b.entries().items()}


def test_keep_steps_writes_when_the_memo_grew_and_a_load_does_not_count_as_saved(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.setattr(sim_run, "_TIMINGS", {})
    small, large = lazy_agentx(limit=6), lazy_agentx(limit=12)
    other = timing_for(small)
    figures(small, other)
    StepStore(tmp_path).save(other, store_key(small, other))
    t = shared_timing(large)  # loads what `other` stored
    assert t.size() == other.size()
    keep_steps(large, t)  # nothing new: not written
    assert StepStore(tmp_path).load(timing_for(large), store_key(large, t)) == other.size()
    figures(large, t)
    assert t.size() > other.size()
    keep_steps(large, t)
    assert StepStore(tmp_path).load(timing_for(large), store_key(large, t)) == t.size()


def test_values_of_the_wrong_type_are_not_read(tmp_path, caplog):
    sc = lazy_agentx()
    t = timing_for(sc)
    store = StepStore(tmp_path)
    key = store_key(sc, t)
    store.path(key).write_bytes(pickle.dumps({"format": 1, "key": key, "entries": {"ratios": {("k",): "1.0"}}}))
    assert store.load(t, key) == 0 and "not a step store" in caplog.text


def test_a_sweep_point_keeps_its_steps_for_the_other_workers(tmp_path, monkeypatch, tiny_yaml):
    from rackserve.sim.sweep import GridPoint, run_point

    monkeypatch.setenv(ENV, str(tmp_path / "steps"))
    monkeypatch.setattr(sim_run, "_TIMINGS", {})
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_yaml)
    first = run_point(GridPoint(str(path), 2, "least-uncached-work"))
    assert len(list((tmp_path / "steps").glob("steps-*.pkl"))) == 1
    monkeypatch.setattr(sim_run, "_TIMINGS", {})  # another worker
    again = run_point(GridPoint(str(path), 2, "least-uncached-work"))
    assert {k: v for k, v in again.items() if k not in ("wall_s", "cpu_s")} == \
        {k: v for k, v in first.items() if k not in ("wall_s", "cpu_s")}
    (timing,) = sim_run._TIMINGS.values()
    assert timing.misses == 0


def _save_many(directory: str, key: str, worker: int) -> None:
    from rackserve.sim.step_cache import CachedTiming

    t = CachedTiming(None)
    store = StepStore(directory)
    for i in range(100):
        t.entries()["ratios"][("decode-tail", f"w{worker}", (i,))] = float(i + worker)
        store.save(t, key)


def test_processes_saving_at_once_lose_nothing(tmp_path):
    """Two processes saving into one file over and over (a search's workers): the lock and the merge
    keep every entry of both, and the file stays readable."""
    import multiprocessing

    from rackserve.sim.step_cache import CachedTiming

    key = "k" * 32
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), key, w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    t = CachedTiming(None)
    assert StepStore(tmp_path).load(t, key) == 200
    assert t.entries()["ratios"][("decode-tail", "w2", (99,))] == 101.0
    assert not list(tmp_path.glob(".steps-*.tmp"))  # no temporary file left behind
