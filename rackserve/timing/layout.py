"""Parallel layouts of one engine instance: how attention and experts spread over its GPUs.

Named layouts of the reference deployment: dep2 prefill, wide-ep(N) decode, tp8 decode. The two
general forms the public deployments run (rackserve validate):
  dep(N)  attention data-parallel over N ranks (each its own batch and KV), experts over EP = N / moe_tp
          ranks (SGLang / TRT-LLM "DP attention + EP", vLLM's DEP); wide-ep(N) is dep(N) inside one NVL72.
  tep(N)  attention tensor-parallel over N GPUs (one batch, heads split N ways), experts over
          EP = N / moe_tp ranks (TRT-LLM "TP8 / EP8" without DP attention; moe_tp = N is plain TP).
"""

from __future__ import annotations

from dataclasses import dataclass

GPUS_PER_TRAY = 4  # NVL72: 18 compute trays of 4 GPUs (REFERENCE)
LAYOUTS = ("dep2", "wide-ep", "tp8", "dep", "tep")
MAX_GPUS = 1024  # an instance spanning nodes over the scale-out network (DeepSeek's EP144 decode unit fits)


@dataclass(frozen=True)
class Layout:
    """How one instance spreads the model over its GPUs.

    dp: data-parallel ranks, each with its own batch and KV (one RankBatch each in a StepBatch).
    tp: tensor-parallel degree of attention inside a rank (heads split tp ways).
    ep: expert-parallel degree (experts spread over ep ranks).
    moe_tp: tensor-parallel degree of each expert (columns split); None: tp (tp8 splits both).
    """

    name: str
    gpus: int
    dp: int
    tp: int
    ep: int
    moe_tp: int | None = None

    @property
    def expert_tp(self) -> int:
        return self.tp if self.moe_tp is None else self.moe_tp

    @property
    def dispatches(self) -> bool:
        """Tokens move to their experts' ranks (all-to-all): DP attention with EP. Under attention TP
        every GPU holds every token after the all-reduce, so each runs its own experts on them."""
        return self.ep > 1 and self.dp > 1

    @property
    def trays(self) -> int:
        return -(-self.gpus // GPUS_PER_TRAY)

    @property
    def key(self) -> str:
        if self.name in ("dep2", "tp8"):
            return self.name
        tail = f"-moetp{self.moe_tp}" if self.moe_tp not in (None, 1) else ""
        return f"{self.name}{self.gpus}{tail}"


def make_layout(name: str, ranks: int | None = None, moe_tp: int = 1) -> Layout:
    """Build a layout by name; `ranks` sets the size of wide-ep (default 8), dep and tep; `moe_tp`
    splits each expert's columns (dep / tep only). ValueError names the field."""
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
    if name in ("dep", "tep"):
        if ranks is None or ranks < 1 or ranks > MAX_GPUS:
            raise ValueError(f"ranks: {name} needs 1..{MAX_GPUS} GPUs, got {ranks}")
        if moe_tp < 1 or ranks % moe_tp:
            raise ValueError(f"moe_tp: must divide the {ranks} GPUs of {name}, got {moe_tp}")
        ep = ranks // moe_tp
        if name == "dep":
            return Layout("dep", gpus=ranks, dp=ranks, tp=1, ep=ep, moe_tp=moe_tp)
        return Layout("tep", gpus=ranks, dp=1, tp=ranks, ep=ep, moe_tp=moe_tp)
    raise ValueError(f"layout: unknown layout {name!r} (known: {', '.join(LAYOUTS)})")


def parse_layout_key(key: str) -> Layout:
    """The layout a Layout.key names ("dep2", "tp8", "wide-ep16", "dep32", "tep8-moetp4")."""
    if key in ("dep2", "tp8"):
        return make_layout(key)
    body, _, tail = key.partition("-moetp")
    moe_tp = int(tail) if tail else 1
    for name in ("wide-ep", "dep", "tep"):
        if body.startswith(name) and body[len(name):].isdigit():
            if name == "wide-ep":
                return make_layout(name, int(body[len(name):]))
            return make_layout(name, int(body[len(name):]), moe_tp)
    raise ValueError(f"layout: cannot read layout key {key!r}")


def _fixed(name: str, ranks: int | None, n: int) -> None:
    if ranks not in (None, n):
        raise ValueError(f"ranks: {name} has {n} ranks, got {ranks}")
