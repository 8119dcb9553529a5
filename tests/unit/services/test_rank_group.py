"""An instance's ranks in one process (services/rank_group.py): the step calls of one event-loop
turn travel as one group call, each rank gets its own answer or its own failure, and a dead group
fails every rank of the call. The group here is an in-process double of the Ray actor handle
(`step_ranks.remote` returns an awaitable, as an ObjectRef is); RankGroup itself runs in the
mock-cluster tests (tests/integration/cluster/test_mock_cluster.py)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from rackserve.config import load_config
from services.launcher import parse_args
from services.rank_group import GroupedRank, InProcessGroup, StepBatcher


class GroupDouble:
    """Answers each step_ranks call with `answer(rank, inbox)`; records the calls."""

    def __init__(self, answer) -> None:
        self.calls: list[dict] = []
        self.answer = answer
        self.step_ranks = SimpleNamespace(remote=self._step_ranks)

    def _step_ranks(self, inboxes: dict):
        self.calls.append(inboxes)
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result({r: self.answer(r, inbox) for r, inbox in inboxes.items()})
        except Exception as exc:  # the whole group died
            future.set_exception(exc)
        return future


async def step_all(group: GroupDouble, inboxes: dict[int, tuple]) -> list:
    batcher = StepBatcher(group)
    ranks = [GroupedRank(batcher, r) for r in range(4)]
    calls = [asyncio.ensure_future(ranks[r].step.remote(inbox)) for r, inbox in inboxes.items()]
    return await asyncio.gather(*calls, return_exceptions=True)


def test_one_group_call_per_turn_and_answers_per_rank() -> None:
    group = GroupDouble(lambda r, inbox: ("stepped", r, inbox))
    got = asyncio.run(step_all(group, {0: (), 2: ("a",), 3: ()}))
    assert got == [("stepped", 0, ()), ("stepped", 2, ("a",)), ("stepped", 3, ())]
    assert group.calls == [{0: (), 2: ("a",), 3: ()}]


def test_a_rank_failure_fails_only_that_rank() -> None:
    group = GroupDouble(lambda r, inbox: RuntimeError("rank 1 broke") if r == 1 else r)
    got = asyncio.run(step_all(group, {0: (), 1: ()}))
    assert got[0] == 0 and isinstance(got[1], RuntimeError)


def test_a_dead_group_fails_every_rank_of_the_call() -> None:
    def dead(r, inbox):
        raise ConnectionError("actor died")

    got = asyncio.run(step_all(GroupDouble(dead), {0: (), 1: ()}))
    assert all(isinstance(g, ConnectionError) for g in got)


class Ranks:
    """RankGroup's methods, recording the thread and order they run in."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def step_ranks(self, inboxes: dict) -> dict:
        self.log.append(("step", threading.current_thread().name))
        return {r: ("stepped", r, inbox) for r, inbox in inboxes.items()}

    def cancel(self, rank: int, request_id: str) -> None:
        self.log.append((f"cancel {rank} {request_id}", threading.current_thread().name))

    def ready(self, rank=None) -> bool:
        return True

    def state(self, rank: int) -> str:
        return f"state {rank}"


def test_ranks_in_the_service_process_answer_as_the_actor_on_their_own_thread() -> None:
    """engine.mock_ranks service: one group call per turn as with the actor, run off the event
    loop on the group's one thread, calls in the order they were made."""
    ranks = Ranks()

    async def go():
        batcher = StepBatcher(InProcessGroup(ranks, "prefill-0"))
        handles = [GroupedRank(batcher, r) for r in range(2)]
        answers = await asyncio.gather(handles[0].step.remote(("a",)), handles[1].step.remote())
        await handles[1].cancel.remote("req-1")
        return answers, await handles[1].state.remote(), await handles[0].ready.remote()

    answers, state, ready = asyncio.run(go())
    assert answers == [("stepped", 0, ("a",)), ("stepped", 1, ())]
    assert state == "state 1" and ready is True
    assert [what for what, _ in ranks.log] == ["step", "cancel 1 req-1"]
    assert all(thread.startswith("ranks-prefill-0") for _, thread in ranks.log)
    assert threading.current_thread().name not in {thread for _, thread in ranks.log}


@pytest.mark.parametrize("scenario", ["nvl72-vr200", "agentx-3dep2-wideep", "local"])
def test_a_simulator_scenario_is_a_deployment_up_can_serve(scenario: str) -> None:
    cfg = load_config(f"scenarios/{scenario}.yaml", environ={"RACKSERVE_ENGINE__KIND": "mock"})
    assert cfg.engine.kind == "mock"
    assert parse_args(["--engine", "mock"]).engine == "mock" and parse_args([]).engine is None
