"""What the front door's /ready answers: whether a request sent now would succeed.

Ready only while the router's KV-event reader reaches Redis, both worker services answered the
last health poll over the very channels requests use (so those are connected), and routing has at
least one prefill and one decode rank in: answering its probe, not quarantined after a failure,
not drained. Otherwise `waiting_for()` names what is missing, in the /ready body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

ROLES = ("prefill", "decode")


@dataclass
class Readiness:
    """Fed by the router's Redis reader (`redis`) and health poll (`answered`); `routable(role)`
    and `connected(role)` are asked live at each /ready."""

    routable: Callable[[str], bool]
    connected: Callable[[str], bool]
    redis: bool = False
    answered: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(ROLES, False))

    def waiting_for(self) -> list[str]:
        """What stands between a request and its success now; empty when ready."""
        missing = [] if self.redis else ["redis: the KV-event stream is not reachable"]
        for role in ROLES:
            if not self.answered[role]:
                missing.append(f"{role}: the {role} service does not answer its health check")
            elif not self.connected(role):
                missing.append(f"{role}: the router is not connected to the {role} service")
            elif not self.routable(role):
                missing.append(f"{role}: no {role} rank is answering and in routing")
        return missing

    def ready(self) -> bool:
        return not self.waiting_for()
