"""A Prometheus registry whose scrapes carry no `*_created` series.

prometheus_client adds a `<name>_created` sample to every counter and histogram; the text format
(0.0.4) prints it as a gauge family of its own, one extra family per metric. Dropping it here, per
registry, leaves the library's process-wide switch (`disable_created_metrics`) alone.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric


class Registry(CollectorRegistry):
    """A CollectorRegistry whose collect() leaves out each family's `_created` samples."""

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            created = f"{family.name}_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family
