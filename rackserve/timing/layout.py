"""Parallel layouts of one engine instance: dep2 prefill, wide-ep(N) decode, tp8 decode."""

from __future__ import annotations

from dataclasses import dataclass

GPUS_PER_TRAY = 4  # NVL72: 18 compute trays of 4 GPUs (REFERENCE)
LAYOUTS = ("dep2", "wide-ep", "tp8")


@dataclass(frozen=True)
class Layout:
    """How one instance spreads the model over its GPUs.

    dp: data-parallel ranks, each with its own batch and KV (one RankBatch each in a StepBatch).
    tp: tensor-parallel degree inside a rank (tp8: 1/8 of heads and of every expert's columns).
    ep: expert-parallel degree (experts spread over ep ranks; dispatch/combine over NVLink).
    """

    name: str
    gpus: int
    dp: int
    tp: int
    ep: int

    @property
    def trays(self) -> int:
        return -(-self.gpus // GPUS_PER_TRAY)

    @property
    def key(self) -> str:
        return self.name if self.name != "wide-ep" else f"wide-ep{self.gpus}"


def make_layout(name: str, ranks: int | None = None) -> Layout:
    """Build a layout by name; `ranks` sets the wide-ep size (default 8). ValueError names the field."""
    if name == "dep2":
        _fixed(name, ranks, 2)
        return Layout("dep2", gpus=2, dp=2, tp=1, ep=2)
    if name == "tp8":
        _fixed(name, ranks, 8)
        return Layout("tp8", gpus=8, dp=1, tp=8, ep=1)
    if name == "wide-ep":
        n = 8 if ranks is None else ranks
        if n < 2 or n > 72:
            raise ValueError(f"ranks: wide-ep needs 2..72 ranks (one NVL72 domain), got {n}")
        return Layout("wide-ep", gpus=n, dp=n, tp=1, ep=n)
    raise ValueError(f"layout: unknown layout {name!r} (known: {', '.join(LAYOUTS)})")


def _fixed(name: str, ranks: int | None, n: int) -> None:
    if ranks not in (None, n):
        raise ValueError(f"ranks: {name} has {n} ranks, got {ranks}")
