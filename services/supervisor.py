"""Keep the launcher's children running: a child that exits is started again after a backoff, the
others keep serving; on stop every child is signalled at once and killed, with whatever it spawned,
by PID after a short grace.

A child may need another (`Supervised.needs`): the prefill and decode services hold rank actors in
the local Ray head, and a new head has none of them. When a needed one dies, its dependants are
stopped at once (their clients get the retryable error now, not after timeouts against actors that
are gone) and started again once it is back and ready; their restart is not counted as a crash.

Children run in their own session, so a terminal's Ctrl-C reaches the launcher only and the
launcher alone decides the order and the grace of the shutdown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 3.0  # SIGTERM -> SIGKILL; every child exits well within it when not wedged
DEPENDANT_GRACE_S = 1.0  # a dependant of a lost child: its actors are gone, it has nothing to finish


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass(frozen=True)
class Backoff:
    """Delay before restart number n (1, 2, ...): initial_s doubled each time, at most max_s; a
    child that stayed up reset_after_s starts again from initial_s."""

    initial_s: float = 0.5
    max_s: float = 8.0
    reset_after_s: float = 30.0

    def delay_s(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * 2 ** max(0, failures - 1))


@dataclass
class Child:
    """One process the launcher started (argv and env kept, so it can be started again)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started_at: float = 0.0

    def launch(self) -> Child:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def relaunch(self) -> None:
        self.launch()


@dataclass
class _Watch:
    """Restart bookkeeping of one supervised thing."""

    failures: int = 0
    restart_at: float | None = None
    restarts: int = 0
    held_for: str | None = None  # stopped until this needed item is back


@dataclass
class Supervised:
    """Anything with a liveness check and a restart (a Child, the Ray head, the embedded Redis)."""

    name: str
    alive: Callable[[], bool]
    relaunch: Callable[[], None]
    started_at: Callable[[], float]
    exit_code: Callable[[], int | None] = lambda: None
    ready: Callable[[], bool] | None = None  # up enough for its dependants (default: alive)
    stop: Callable[[], None] = lambda: None  # used when something it needs is lost
    needs: tuple[str, ...] = ()  # names of the items it cannot outlive


def supervised_child(child: Child, needs: tuple[str, ...] = ()) -> Supervised:
    return Supervised(
        child.name, child.alive, child.relaunch, lambda: child.started_at, lambda: child.returncode,
        stop=lambda: stop_all([child], DEPENDANT_GRACE_S), needs=needs,
    )


@dataclass
class Supervisor:
    """`tick()` every fraction of a second: restarts what died, with `backoff`."""

    backoff: Backoff = field(default_factory=Backoff)
    items: list[Supervised] = field(default_factory=list)
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    _watch: dict[str, _Watch] = field(default_factory=dict)

    def add(self, item: Supervised) -> None:
        assert item.name not in self._watch, f"{item.name} supervised twice"
        self.items.append(item)
        self._watch[item.name] = _Watch()

    def restarts(self, name: str) -> int:
        return self._watch[name].restarts

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for item in self.items:
            self._check(item, self._watch[item.name], now)

    def _check(self, item: Supervised, watch: _Watch, now: float) -> None:
        if watch.held_for is not None:
            self._resume_if_back(item, watch)
            return
        if watch.restart_at is None and item.alive():
            if watch.failures and now - item.started_at() >= self.backoff.reset_after_s:
                watch.failures = 0
            return
        if watch.restart_at is None:
            watch.failures += 1
            watch.restart_at = now + self.backoff.delay_s(watch.failures)
            self.log(
                f"rackserve up: {item.name} exited ({item.exit_code()}); restarting in "
                f"{watch.restart_at - now:.1f} s"
            )
            self._hold_dependants(item.name)
            return
        if now < watch.restart_at:
            return
        watch.restart_at = None
        watch.restarts += 1
        try:
            item.relaunch()
        except Exception as exc:  # e.g. the embedded Redis's port is still held: try again later
            self.log(f"rackserve up: restarting {item.name} failed: {exc}")
            return
        self.log(f"rackserve up: {item.name} restarted (restart {watch.restarts})")

    def _hold_dependants(self, lost: str) -> None:
        """Stop every item that needs `lost` until it is back (see the module docstring)."""
        for item in self.items:
            watch = self._watch[item.name]
            if lost not in item.needs or watch.held_for is not None:
                continue
            self.log(f"rackserve up: {lost} is gone, stopping {item.name} until it is back")
            watch.held_for, watch.restart_at = lost, None
            item.stop()

    def _resume_if_back(self, item: Supervised, watch: _Watch) -> None:
        needed = next(i for i in self.items if i.name == watch.held_for)
        if self._watch[needed.name].restart_at is not None or not (needed.ready or needed.alive)():
            return
        watch.held_for = None
        watch.restarts += 1
        try:
            item.relaunch()
        except Exception as exc:  # counted as its own failure on the next tick
            self.log(f"rackserve up: restarting {item.name} failed: {exc}")
            return
        self.log(
            f"rackserve up: {needed.name} is back, {item.name} restarted (restart {watch.restarts})"
        )


def stop_all(children: list[Child], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every child at once, SIGKILL what is left after `grace_s`, then every process
    they spawned (collected before signalling, by PID)."""
    spawned = [pid for c in children if c.pid is not None for pid in descendants(c.pid)]
    live = [c for c in children if c.alive()]
    for child in live:
        child.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    deadline = time.monotonic() + grace_s
    for child in live:
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            child.proc.kill()  # type: ignore[union-attr]
            child.proc.wait()  # type: ignore[union-attr]
    kill_pids(spawned)
