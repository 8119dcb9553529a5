"""The planner: each tick it reads per-instance observations and decides how many prefill and decode
instances should run (policies `fixed`, `load`, `sla`), within a GPU budget; `Fleet` carries the
decisions out with start-up delays and drains. Pure: the simulator and a launcher drive it."""

from rackserve.planner.fleet import Fleet, InstanceSlot
from rackserve.planner.observation import InstanceObs, Targets, TickObs
from rackserve.planner.policies import PLANNERS, make_planner
from rackserve.planner.settings import PlannerSettings

__all__ = ["PLANNERS", "Fleet", "InstanceObs", "InstanceSlot", "PlannerSettings", "Targets", "TickObs", "make_planner"]
