"""What routing needs of the cost model: prefill time on a layout, and KV transfer time from a tier.

`rackserve.timing.TimingModel` provides exactly these two methods; policies depend on this
protocol only, so unit tests can pass a small linear double.
"""

from __future__ import annotations

from typing import Protocol


class CostModel(Protocol):
    def prefill_estimate_s(self, layout: str, new_tokens: int, cached_tokens: int) -> float:
        """Seconds to prefill `new_tokens` on top of `cached_tokens` of context on one rank of `layout`."""
        ...

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        """Seconds to bring `tokens` of KV from pool tier `tier` ("pool_hbm" | "pool_dram") to a rank."""
        ...
