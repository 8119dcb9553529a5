"""The launcher's supervisor on real processes: a child that dies is started again after its
backoff (the others untouched), and stop_all ends every child within the grace, even one that
ignores SIGTERM, together with what it spawned."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from services.supervisor import (
    Backoff,
    Child,
    Supervised,
    Supervisor,
    descendants,
    stop_all,
    supervised_child,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [  # ignores SIGTERM and has a grandchild
    sys.executable,
    "-c",
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
]


def _child(tmp: Path, name: str, argv: list[str]) -> Child:
    return Child(name, argv, dict(os.environ), tmp / f"{name}.log").launch()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_backoff_doubles_up_to_its_cap():
    b = Backoff(initial_s=0.5, max_s=4.0)
    assert [b.delay_s(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_killed_child_is_restarted_after_its_backoff_and_the_others_keep_running(tmp_path):
    a, b = _child(tmp_path, "a", SLEEPER), _child(tmp_path, "b", SLEEPER)
    lines: list[str] = []
    sup = Supervisor(Backoff(initial_s=0.3), log=lines.append)
    sup.add(supervised_child(a))
    sup.add(supervised_child(b))
    try:
        first_a, first_b = a.pid, b.pid
        os.kill(first_a, signal.SIGKILL)
        a.proc.wait()
        sup.tick()
        assert not a.alive() and sup.restarts("a") == 0  # waits out the backoff first
        time.sleep(0.35)
        sup.tick()
        assert a.alive() and a.pid != first_a and sup.restarts("a") == 1
        assert b.pid == first_b and b.alive() and sup.restarts("b") == 0
        assert any("a exited (-9)" in line for line in lines), lines
    finally:
        stop_all([a, b])


def test_stop_all_kills_a_child_ignoring_sigterm_and_its_children_within_the_grace(tmp_path):
    stubborn, plain = _child(tmp_path, "s", STUBBORN), _child(tmp_path, "p", SLEEPER)
    deadline = time.monotonic() + 10
    while not descendants(stubborn.pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = descendants(stubborn.pid)[0]
    started = time.monotonic()
    stop_all([stubborn, plain], grace_s=1.0)
    assert time.monotonic() - started < 3.0
    assert not stubborn.alive() and not plain.alive()
    deadline = time.monotonic() + 2  # SIGKILL is delivered asynchronously
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the grandchild survived"
        time.sleep(0.05)


def test_a_dependant_is_stopped_when_what_it_needs_dies_and_restarted_once_that_is_ready(tmp_path):
    """The prefill and decode services need the Ray head (their rank actors live in it): when it
    dies they are stopped at once, and started again only after it is back and ready."""
    head, worker, other = (_child(tmp_path, n, SLEEPER) for n in ("head", "worker", "other"))
    head_ready = {"ok": True}
    lines: list[str] = []
    sup = Supervisor(Backoff(initial_s=0.3), log=lines.append)
    sup.add(
        Supervised(
            "head", head.alive, head.relaunch, lambda: head.started_at,
            ready=lambda: head.alive() and head_ready["ok"],
        )
    )
    sup.add(supervised_child(worker, needs=("head",)))
    sup.add(supervised_child(other))
    try:
        first_worker, first_other = worker.pid, other.pid
        os.kill(head.pid, signal.SIGKILL)
        head.proc.wait()
        head_ready["ok"] = False  # the new head takes a while to be ready
        sup.tick()
        assert not worker.alive(), "a dependant of a dead child keeps running"
        assert other.alive() and other.pid == first_other
        time.sleep(0.35)
        sup.tick()  # the head restarts; not ready yet: the worker waits
        assert head.alive() and not worker.alive()
        head_ready["ok"] = True
        sup.tick()
        assert worker.alive() and worker.pid != first_worker
        assert sup.restarts("worker") == 1 and sup.restarts("head") == 1
        sup.tick()  # its restart was not a crash: no second restart scheduled
        assert worker.alive() and sup.restarts("worker") == 1
        assert any("head is gone, stopping worker" in line for line in lines), lines
    finally:
        stop_all([head, worker, other])
