"""Progress ticks and the CLI's bar: a trace's bar ends at its total and stops; a closed loop's bar
runs on simulated seconds (its request count is not known up front) and also ends and stops."""

from rich.console import Console
from rich.progress import Progress

from rackserve.sim.cli import progress_bar
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.workload.build import build_source
from rackserve.workload.request import Request
from rackserve.workload.source import ListSource


def _scenario(workload):
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 1}], "decode": [{"layout": "wide-ep", "ranks": 2, "count": 1}]},
        "workload": workload,
    })


def _run(timing, scenario, source):
    ticks = []
    res = Simulator(scenario, timing, "least-uncached-work", source, progress=ticks.append).run()
    return res, ticks


def test_a_trace_ticks_every_256_requests_and_ends_at_its_total(timing):
    reqs = [Request(i, 0.01 * i, 100, 4, (i,)) for i in range(600)]
    res, ticks = _run(timing, _scenario({"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1}),
                      ListSource(reqs))
    assert [t.done for t in ticks] == [256, 512, 600]
    last = ticks[-1]
    assert last.final and last.total == 600 and last.sent == 600 and last.in_flight == 0
    assert res.completed == 600


AGENTX = {"kind": "agentx", "concurrency": 8, "sessions": 40, "duration_s": 60.0, "system_prompt_tokens": 100,
          "tool_defs_tokens": 100, "first_user_tokens": 50, "turns_min": 6, "turns_max": 10,
          "tool_output_tokens_min": 10, "tool_output_tokens_max": 20, "output_tokens": 4, "think_time_mean_s": 0.1}


def test_a_closed_loop_ticks_in_simulated_time_up_to_its_end(timing):
    sc = _scenario(AGENTX)  # sessions of random length: the request count is not known up front
    res, ticks = _run(timing, sc, build_source(sc.workload, 64, sc.config.engine.model_id))
    last = ticks[-1]
    assert len(ticks) > 1 and all(t.total is None and t.end_s == 60.0 for t in ticks)
    assert last.final and last.done == res.completed + res.rejected > 256
    assert [t.now_s for t in ticks] == sorted(t.now_s for t in ticks) and last.now_s > 0


def test_a_uniform_closed_loop_knows_its_request_count_from_the_first_tick(timing):
    sc = _scenario({"kind": "uniform", "concurrency": 4, "requests": 300, "prompt_tokens": 100, "output_tokens": 4})
    res, ticks = _run(timing, sc, build_source(sc.workload, 64, sc.config.engine.model_id))
    assert [t.done for t in ticks] == [256, 300] and all(t.total == 300 for t in ticks)  # was "?" until the end
    assert ticks[-1].final and res.completed == 300


def test_the_bar_finishes_at_the_true_figure_and_stops_its_clock(timing):
    sc = _scenario(AGENTX)
    with Progress(console=Console(file=open("/dev/null", "w"))) as bar:  # noqa: SIM115
        update = progress_bar(bar, "least-uncached-work")
        Simulator(sc, timing, "least-uncached-work", build_source(sc.workload, 64, sc.config.engine.model_id),
                  progress=update).run()
        task = bar.tasks[0]
        assert task.finished and task.finished_time is not None  # the elapsed clock stopped
        assert task.completed == task.total > 0
        assert " requests done" in task.description and "(simulated s" in task.description
