"""What the simulator tells a progress display, and when.

A tick carries both clocks: requests done of those known up front (a trace: its length; a uniform
closed loop: its request count) and the simulated time of where the run stops (closed loop: the
measured window's end, the horizon or the workload's duration), so a display can show "done /
total" where the count is known and "simulated s / end" for a closed loop whose request count is
not known until the end. The last tick (`final`) comes
when the run is over, whatever the count, so a display ends at its true figure and stops its clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TICK_EVERY = 256  # requests done between ticks


@dataclass(frozen=True)
class ProgressTick:
    done: int  # requests finished or rejected so far (warm-up turns included)
    sent: int  # requests arrived so far
    total: int | None  # requests the run will see, when known up front (a trace; a uniform closed loop's count)
    now_s: float  # the simulated clock
    end_s: float | None  # where the run stops, when known
    final: bool = False

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


Progress = Callable[[ProgressTick], None]
