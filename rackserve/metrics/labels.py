"""Label values and histogram buckets shared by every metric group (one spelling each), and
the label set of one rank."""

from __future__ import annotations

from dataclasses import dataclass

# Label values used across services: one spelling each.
TIERS = ("rank_hbm", "pool_hbm", "pool_dram", "miss")  # where a prompt token's KV came from
POOL_TIERS = ("pool_hbm", "pool_dram")
ROLES = ("prefill", "decode")
STATUSES = ("finished", "error", "aborted", "rejected")  # how a front-door request ended
TTFT_COMPONENTS = ("queue", "prefill", "kv_transfer", "first_decode")
TOKEN_KINDS = ("cached", "uncached", "output")
RANK_LABELS = ("instance", "dp_rank", "role")
VLLM_LABELS = ("model_name", "engine")

# Buckets in simulated seconds. Rubin decode steps are a few ms, prefill of long prompts seconds.
REQUEST_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
WALL_FAST_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class RankKey:
    """One data-parallel rank of one instance: the label set of every per-rank series."""

    instance: str
    dp_rank: int
    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {self.role!r}")
        if self.dp_rank < 0:
            raise ValueError(f"dp_rank: must be >= 0, got {self.dp_rank}")

    def labels(self) -> dict[str, str]:
        return {"instance": self.instance, "dp_rank": str(self.dp_rank), "role": self.role}

    @property
    def engine(self) -> str:
        """The vLLM `engine` label of this rank (one vLLM engine core per DP rank)."""
        return f"{self.instance}/{self.dp_rank}"
