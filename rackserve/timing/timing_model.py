"""TimingModel: the cost model's entry point (hardware + model + optimizations -> step times)."""

from __future__ import annotations

import numpy as np

from rackserve.timing import comm
from rackserve.timing.batch import RankBatch, StepBatch, StepCost
from rackserve.timing.engram_placement import HBM_SHARDED, check_placement
from rackserve.timing.layout import Layout, make_layout
from rackserve.timing.optimizations import Optimizations, parse_optimizations
from rackserve.timing.overlap import OVERLAPPED, overlap_total, overlapped, split_in_two
from rackserve.timing.precision import with_precision
from rackserve.timing.spec import HardwareSpec, ModelSpec, load_hardware, load_model
from rackserve.timing.speculative import (
    Speculation,
    draft_batches,
    draft_model,
    settled_batch,
    speculation,
    verify_batch,
    with_drafts,
)
from rackserve.timing.step_cost import CostContext, step_cost
from rackserve.timing.step_plan import (
    Prepared,
    StepPlan,
    build_plan,
    decode_passes,
    fast_step_cost,
    features_together,
    general_costs,
    prefill_rows,
    prepared_cost,
)

KV_TIERS = ("pool_hbm", "pool_dram")
# The router's reference batch: a busy prefill rank's step, which the engine caps at its
# max_num_batched_tokens (vLLM's 8192 for the OpenAI server on a >= 70 GiB GPU, sched/limits.py);
# a scenario's chunk knob (sim.max_num_batched_tokens / prefill_chunk_tokens) replaces it.
REFERENCE_PREFILL_TOKENS = 8192


class TimingModel:
    """Per-step simulated durations of the target model on the target GPUs.

    Immutable after construction; per-layout constants are cached inside. Typical use:
        tm = TimingModel.create(hardware="vr200", model="deepseek-v4.1-flash", optimizations="rubin-optimized")
        cost = tm.step_time("decode", tm.layout("wide-ep", ranks=8), StepBatch(...))
    """

    def __init__(
        self,
        hardware: HardwareSpec,
        model: ModelSpec,
        optimizations: Optimizations,
        block_tokens: int = 64,
        engram_placement: str = HBM_SHARDED,
        acceptance_length: float | None = None,
        reference_chunk_tokens: int = REFERENCE_PREFILL_TOKENS,
    ) -> None:
        assert reference_chunk_tokens > 0
        self.hardware = hardware
        self.acceptance_length = acceptance_length
        self.reference_chunk_tokens = reference_chunk_tokens
        self.engram_placement = check_placement(engram_placement)
        self.model = model
        self.requested_optimizations = optimizations
        # switches the hardware cannot run are dropped here (skipped_switches says why)
        self.optimizations, self.skipped_switches = optimizations.applicable(hardware)
        if self.optimizations.mtp and model.mtp is None:
            self.optimizations = self.optimizations.with_switch("mtp", False)
            self.skipped_switches = {
                **self.skipped_switches,
                "mtp": f"{model.name} has no draft layers",
            }
        self.block_tokens = block_tokens
        self.speculation: Speculation | None = (
            speculation(model, acceptance_length) if self.optimizations.mtp else None
        )
        self._draft: TimingModel | None = None
        self._ctx = CostContext.build(hardware, model, self.optimizations, engram_placement)
        self._layouts: dict[tuple[str, int | None, int], Layout] = {}
        self._estimates: dict[tuple[str, int, int], float] = {}
        self._estimate_bases: dict[Layout, float] = {}  # prefill_estimate_s' reference step per layout
        self._plans: dict[tuple[Layout, str], StepPlan] = {}
        self._plans_by_id: dict[tuple[int, str], tuple[Layout, StepPlan]] = {}

    @staticmethod
    def create(
        hardware: str = "vr200",
        model: str = "deepseek-v4.1-flash",
        optimizations: str | Optimizations = "rubin-optimized",
        block_tokens: int = 64,
        engram_placement: str = HBM_SHARDED,
        acceptance_length: float | None = None,
        reference_chunk_tokens: int = REFERENCE_PREFILL_TOKENS,
        expert_precision: str | None = None,
        attention_math: str | None = None,
        drafts: int | None = None,
    ) -> TimingModel:
        opts = (
            optimizations
            if isinstance(optimizations, Optimizations)
            else parse_optimizations(optimizations)
        )
        return TimingModel(
            load_hardware(hardware), with_drafts(with_precision(load_model(model), expert_precision, attention_math),
                                                 drafts), opts,
            block_tokens, engram_placement, acceptance_length, reference_chunk_tokens,
        )

    @staticmethod
    def from_section(section, reference_chunk_tokens: int = REFERENCE_PREFILL_TOKENS) -> TimingModel:
        """From rackserve.config.TimingSection (hardware, model, optimizations, target_block_tokens,
        engram_placement, speculative.acceptance_length); `reference_chunk_tokens`: the engine's
        max_num_batched_tokens (the router's reference prefill step)."""
        spec = getattr(section, "speculative", None)
        return TimingModel.create(
            section.hardware,
            section.model,
            section.optimizations,
            section.target_block_tokens,
            section.engram_placement,
            None if spec is None else spec.acceptance_length,
            reference_chunk_tokens,
            getattr(section, "expert_precision", None),
            getattr(section, "attention_math", None),
            None if spec is None else getattr(spec, "drafts", None),
        )

    def _again(self, hardware: HardwareSpec, optimizations: Optimizations) -> TimingModel:
        return TimingModel(
            hardware, self.model, optimizations, self.block_tokens, self.engram_placement,
            self.acceptance_length, self.reference_chunk_tokens,
        )

    def with_hardware(self, hardware: HardwareSpec) -> TimingModel:
        return self._again(hardware, self.requested_optimizations)

    def with_reference_chunk(self, tokens: int) -> TimingModel:
        """The same model with the router's reference prefill step at `tokens` (the engine's chunk)."""
        if tokens == self.reference_chunk_tokens:
            return self
        return TimingModel(
            self.hardware, self.model, self.requested_optimizations, self.block_tokens,
            self.engram_placement, self.acceptance_length, tokens,
        )

    def with_optimizations(self, optimizations: str | Optimizations) -> TimingModel:
        opts = (
            optimizations
            if isinstance(optimizations, Optimizations)
            else parse_optimizations(optimizations)
        )
        return self._again(self.hardware, opts)

    def layout(self, name: str, ranks: int | None = None, moe_tp: int = 1) -> Layout:
        key = (name, ranks, moe_tp)
        if key not in self._layouts:
            self._layouts[key] = make_layout(name, ranks, moe_tp)
        return self._layouts[key]

    def step_time(self, phase: str, layout: Layout, batch: StepBatch) -> StepCost:
        """Simulated duration of one lockstep step of `layout` computing `batch`, with breakdown.
        The fast path (step_plan.py): per-(layout, phase) constants precomputed once. With
        two-batch-overlap on an EP layout, the faster of the serial and the overlapped step."""
        if phase == "prefill" and self._overlaps(layout) and len(batch.ranks) == layout.dp:
            # the rank rows of the step and of its halves, computed together (their memo)
            halves = split_in_two(batch)
            prefill_rows(self._plan(layout, phase), [batch.ranks] + ([] if halves is None else [h.ranks for h in halves]))
        return self._overlap(phase, layout, batch, self._fast)

    def _fast(self, phase: str, layout: Layout, batch: StepBatch) -> StepCost:
        return fast_step_cost(self._ctx, self._plan(layout, phase), batch, self.kv_transfer_s)

    def _plan(self, layout: Layout, phase: str) -> StepPlan:
        hit = self._plans_by_id.get((id(layout), phase))
        if hit is not None and hit[0] is layout:  # identity, so a recycled id never matches
            return hit[1]
        plan = self._plans.get((layout, phase))
        if plan is None:
            if phase not in ("prefill", "decode"):
                raise ValueError(f"phase: must be 'prefill' or 'decode', got {phase!r}")
            plan = self._plans[(layout, phase)] = build_plan(self._ctx, layout, phase)
        if len(self._plans_by_id) > 1000:
            self._plans_by_id.clear()
        self._plans_by_id[(id(layout), phase)] = (layout, plan)
        return plan

    def _reference(self, phase: str, layout: Layout, batch: StepBatch) -> StepCost:
        return step_cost(self._ctx, phase, layout, batch, self.kv_transfer_s)

    def _overlap(self, phase: str, layout: Layout, batch: StepBatch, price) -> StepCost:
        serial = price(phase, layout, batch)
        if not (self.optimizations.two_batch_overlap and layout.ep > 1):
            return serial
        if serial.breakdown.get("dispatch_combine", 0.0) <= 0.0:
            return serial
        halves = split_in_two(batch)
        if halves is None:
            return serial
        a, b = (price(phase, layout, h) for h in halves)
        moe_layers = self.model.layers - self.model.moe.first_dense_layers
        return overlapped(serial, a, b, moe_layers)

    def step_time_reference(self, phase: str, layout: Layout, batch: StepBatch) -> StepCost:
        """The same cost by the readable reference path (step_cost.py): slower, for checking."""
        return self._overlap(phase, layout, batch, self._reference)

    @property
    def verify_tokens(self) -> int:
        """Positions each decoding sequence computes per step: drafts + 1 with MTP, else 1."""
        return self.speculation.verify_tokens if self.speculation else 1

    def expected_accepted_tokens(self) -> float:
        """Tokens a decoding sequence gains per step on average (1.0 without MTP)."""
        return self.speculation.expected_accepted_tokens if self.speculation else 1.0

    def speculative_step_time(self, layout: Layout, batch: StepBatch) -> StepCost:
        """One decode step with speculative decoding: the verify pass over `batch` (each decoding
        sequence's new_tokens = verify_tokens positions; speculative.verify_batch widens a
        one-token batch) plus the draft passes, one after another ("mtp_draft": a one-layer pass
        over the same positions, then draft_tokens - 1 passes of one token per sequence).
        accepted_tokens is the acceptance model's expectation. Without MTP: step_time("decode").

        Priced as speculative_step_time_by_passes prices it, to the bit, with less work: the verify
        pass and the first draft pass share the batch's (and its halves') context sums, and the
        one-token draft passes are priced together (decode_passes), without their batches."""
        if self.speculation is None:
            return self.step_time("decode", layout, batch)
        draft = self._draft_model()
        ranks = batch.ranks
        if len(ranks) != layout.dp:  # the pass-by-pass path raises the error
            return self.speculative_step_time_by_passes(layout, batch)
        prep = Prepared(ranks)
        if prep.new.shape[0] == 0:  # no sequence at all: the general path's empty step
            return self.speculative_step_time_by_passes(layout, batch)
        verify = self._step_prepared(layout, batch, prep)
        first = draft._step_prepared(layout, batch, prep)
        rest = draft._draft_passes(layout, batch, prep, self.speculation.draft_tokens - 1)
        return self._speculative_cost(verify, first, rest)

    def speculative_step_time_by_passes(self, layout: Layout, batch: StepBatch) -> StepCost:
        """speculative_step_time the readable way, pass by pass: step_time of the verify batch and
        of each of speculative.draft_batches on the draft model (the reference of the fast path)."""
        verify = self.step_time("decode", layout, batch)
        if self.speculation is None:
            return verify
        passes = [self._draft_model().step_time("decode", layout, b)
                  for b in draft_batches(batch, self.speculation.draft_tokens)]  # fmt: skip
        return self._speculative_cost(verify, passes[0], [(p.total_s, p.rank_busy_s, p.hidden_s) for p in passes[1:]])

    def _draft_model(self) -> TimingModel:
        if self._draft is None:
            draft_opts = self.optimizations.with_switch("mtp", False)
            # the draft passes run inside the step's graph: its host work is the verify pass's alone
            quiet = self.hardware.model_copy(update={"step_overhead_s": 0.0})
            self._draft = TimingModel(quiet, draft_model(self.model, layers=1), draft_opts, self.block_tokens)
        return self._draft

    def _speculative_cost(self, verify: StepCost, first: StepCost, rest: list[tuple]) -> StepCost:
        """The speculative step from its verify pass, its first draft pass and the (total_s,
        rank_busy_s, hidden_s) of each later draft pass: the verify pass plus the draft passes."""
        passes = [(first.total_s, first.rank_busy_s, first.hidden_s), *rest]
        draft_s = sum(p[0] for p in passes)
        breakdown = {**verify.breakdown, "mtp_draft": draft_s}
        dominant = max(first.breakdown, key=first.breakdown.get) if first.breakdown else ""
        bound = {**verify.bound, "mtp_draft": first.bound.get(dominant, "memory")}
        busy = tuple(v + sum(d) for v, *d in zip(verify.rank_busy_s, *(p[1] for p in passes), strict=True))
        hidden = dict(verify.hidden_s)
        for p in passes:
            for k, v in p[2].items():
                hidden[k] = hidden.get(k, 0.0) + v
        return StepCost(
            verify.total_s + draft_s,
            breakdown,
            busy,
            bound,
            hidden,
            self.speculation.expected_accepted_tokens,
        )

    def _overlaps(self, layout: Layout) -> bool:
        return self.optimizations.two_batch_overlap and layout.ep > 1

    def _step_prepared(self, layout: Layout, batch: StepBatch, prep: Prepared) -> StepCost:
        """step_time("decode", layout, batch) of a batch whose Prepared form is `prep` (its halves'
        kept on it), so that another model pricing the same batch reads the same sums."""
        plan = self._plan(layout, "decode")
        if not self._overlaps(layout):
            return prepared_cost(self._ctx, plan, batch, prep, self.kv_transfer_s)
        if prep.halves is None:  # the halves before the serial step, so that their sums come together
            halves = split_in_two(batch)
            prep.halves = (halves, None if halves is None else tuple(Prepared(h.ranks) for h in halves))
        halves, preps = prep.halves
        if halves is not None:
            features_together([prep, *preps], plan.groups)
            if not (prep.single_token or preps[0].single_token or preps[1].single_token):
                # all three by the general path, together
                serial, a, b = general_costs(
                    self._ctx, plan, [(batch, prep), *zip(halves, preps, strict=True)], self.kv_transfer_s
                )
                if serial.breakdown.get("dispatch_combine", 0.0) <= 0.0:
                    return serial
                return overlapped(serial, a, b, self.model.layers - self.model.moe.first_dense_layers)
        serial = prepared_cost(self._ctx, plan, batch, prep, self.kv_transfer_s)
        if serial.breakdown.get("dispatch_combine", 0.0) <= 0.0:
            return serial
        if halves is None:
            return serial
        a, b = (prepared_cost(self._ctx, plan, h, p, self.kv_transfer_s) for h, p in zip(halves, preps, strict=True))
        return overlapped(serial, a, b, self.model.layers - self.model.moe.first_dense_layers)

    def _draft_passes(self, layout: Layout, batch: StepBatch, prep: Prepared, k: int) -> list[tuple]:
        """The k one-token draft passes after the first (speculative.draft_batches[1:]) as
        step_time("decode") would price them, as (total_s, rank_busy_s, hidden_s) each: the
        sequences of every rank one token each, at context cached + new + i - 1 for pass i."""
        if k <= 0:
            return []
        counts, ends = prep.counts, prep.ends
        if prep.spread is not None:  # the distinct batches' sequences back in rank order
            counts = counts[prep.spread]
            first = np.cumsum(counts) - counts
            ends = ends[np.repeat(prep.starts[prep.spread] - first, counts) + np.arange(int(counts.sum()))]
        lens = counts.tolist()
        cached = (ends + np.arange(1, k + 1)[:, None]) - 1  # [k, n]: pass i's cached + new + i - 1
        plan = self._plan(layout, "decode")
        serial = decode_passes(self._ctx, plan, lens, cached, batch.expert_tokens)
        if not self._overlaps(layout) or max(lens) < 2:  # no rank splits: no halves (split_in_two)
            return [(t, busy, {}) for t, _, busy in serial]
        # the halves: each rank's first (n + 1) // 2 sequences, then the others (overlap._split_rank)
        heads = (counts + 1) // 2
        local = np.arange(cached.shape[1]) - np.repeat(np.cumsum(counts) - counts, counts)
        in_a = local < np.repeat(heads, counts)
        experts = None if batch.expert_tokens is None else np.asarray(batch.expert_tokens) / 2.0
        a = decode_passes(self._ctx, plan, heads.tolist(), cached[:, in_a], experts)
        b = decode_passes(self._ctx, plan, (counts - heads).tolist(), cached[:, ~in_a], experts)
        layers = max(self.model.layers - self.model.moe.first_dense_layers, 1)
        out = []
        host = self.hardware.step_overhead_s
        for s, x, y in zip(serial, a, b, strict=True):
            out.append(_overlapped_pass(s, x, y, layers, host))
        return out

    def decode_token_time(self, layout: Layout, batch: StepBatch) -> StepCost:
        """The time per output token of a decode step, for a scheduler that advances each sequence
        one token per "step": with MTP, a batch of single-token decodes is priced as one speculative
        step over the widened verify batch divided by its expected accepted tokens (every component
        scaled), so TPOT and KV growth follow accepted tokens in expectation. A batch with longer
        chunks (newcomers' tails, recompute after preemption) is a mixed step (mixed_token_time).
        MTP off: step_time("decode")."""
        if self.speculation is None:
            return self.step_time("decode", layout, batch)
        if not batch.single_token:
            return self.mixed_token_time(layout, batch)
        return per_token(self.verify_step_time(layout, batch))

    def verify_step_time(self, layout: Layout, batch: StepBatch) -> StepCost:
        """The speculative step of a batch of single-token decodes widened to the verify block
        (what decode_token_time divides by the accepted tokens: per_token). MTP on only."""
        return self.speculative_step_time(layout, verify_batch(batch, self.speculation.verify_tokens))

    def mixed_token_time(self, layout: Layout, batch: StepBatch, settled: StepCost | None = None) -> StepCost:
        """A mixed decode step as a real engine runs it: running sequences keep draft + verify
        (accepting the acceptance length), sequences computing more than one token (a newcomer's
        tail + first token, a recompute chunk) compute those in the same step, one roofline over
        both (speculative.verify_batch keeps their tokens). For the lazy clock, which moves every
        sequence one token per "step", it is the step's time less the (A - 1) per-token steps of
        the same sequences once settled that follow it (A = accepted tokens): then the running
        sequences' A tokens take exactly the mixed step, and the newcomers' extra work is what the
        step adds, whatever their number. Components are clipped at 0 (total = their sum).
        `settled`: verify_step_time of settled_batch(batch) when the caller has it already (a
        batch of equal contents prices the same, whichever of its ranks share one RankBatch)."""
        verify = self.speculation.verify_tokens
        mixed = self.speculative_step_time(layout, verify_batch(batch, verify))
        if settled is None:
            settled = self.verify_step_time(layout, settled_batch(batch))
        w = 1.0 - 1.0 / settled.accepted_tokens

        def less(a: dict, b: dict) -> dict:
            return {k: max(0.0, a.get(k, 0.0) - w * b.get(k, 0.0)) for k in {**a, **b}}

        breakdown = less(mixed.breakdown, settled.breakdown)
        busy = tuple(max(0.0, m - w * p) for m, p in zip(mixed.rank_busy_s, settled.rank_busy_s, strict=True))
        return StepCost(sum(breakdown.values()), breakdown, busy, mixed.bound,
                        less(mixed.hidden_s, settled.hidden_s))

    def decode_leap(self, layout: Layout, batch: StepBatch, steps: int) -> StepCost:
        """`steps` consecutive single-token decode steps of the same sequences (each step adds one
        token to every context): the step cost at the mid-point contexts, scaled by `steps`. Exact
        where the cost is linear in context (memory-bound attention, indexer scan); lets a simulator
        leap between events instead of stepping token by token."""
        if steps <= 0:
            raise ValueError(f"steps: must be positive, got {steps}")
        half = (steps - 1) // 2
        mid = StepBatch(
            tuple(
                RankBatch(
                    rb.new_tokens, rb.cached_tokens + half, rb.pool_hbm_tokens, rb.pool_dram_tokens
                )
                for rb in batch.ranks
            ),
            batch.expert_tokens,
        )
        one = self.decode_token_time(layout, mid)
        return StepCost(
            one.total_s * steps,
            {k: v * steps for k, v in one.breakdown.items()},
            tuple(b * steps for b in one.rank_busy_s),
            one.bound,
        )

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        """Time to bring `tokens` of pooled KV from a pool tier into a rank's HBM: latency once, bytes
        at the tier's bandwidth, plus a small per-block cost (blocks of `block_tokens`, 64 in the
        target deployment)."""
        if tier not in KV_TIERS:
            raise ValueError(f"tier: must be one of {KV_TIERS}, got {tier!r}")
        if tokens <= 0:
            return 0.0
        hw = self.hardware
        bytes_ = tokens * self.model.kv_bytes_per_token
        blocks = (
            -(-tokens // self.block_tokens) * hw.kv_block_overhead_s
        )  # target_block_tokens per block
        if tier == "pool_hbm":
            return float(comm.p2p_time(hw, bytes_)) + blocks
        return hw.nvlink_latency_s + bytes_ / comm.pool_dram_bw(hw) + blocks

    def pd_transfer_s(self, tokens: int) -> float:
        """Prefill rank -> decode rank: the prompt's KV plus its sliding-window buffer, over the path
        it takes (comm.pd_path_time: NVLink inside a rack-sized NVLink domain, else the NICs)."""
        if tokens <= 0:
            return 0.0
        bytes_ = tokens * self.model.kv_bytes_per_token + self.model.window_buffer_bytes
        return float(comm.pd_path_time(self.hardware, bytes_))

    def prefill_estimate_s(self, layout: Layout, new_tokens: int, cached_tokens: int) -> float:
        """Cheap scalar for the router: the time this prompt adds to a busy prefill rank of `layout`,
        i.e. step(reference batch + prompt) - step(reference batch), the reference being one
        reference_chunk_tokens-token prompt on every rank (the engine's max_num_batched_tokens, the
        largest step its prefill ranks run). A lone small prompt is bound by streaming
        all expert weights, which a batched prefill pays once for all its prompts; the marginal cost
        is what distinguishes a cache hit from a miss. Memoized per (layout, new, cached)."""
        if new_tokens <= 0:
            return 0.0
        key = (layout.key, int(new_tokens), int(cached_tokens))
        hit = self._estimates.get(key)
        if hit is not None:
            return hit
        ref = RankBatch.of([self.reference_chunk_tokens])
        with_prompt = RankBatch.of([self.reference_chunk_tokens, new_tokens], [0, cached_tokens])
        base = self._estimate_bases.get(layout)
        if base is None:  # the reference step: one per layout
            base = self._estimate_bases[layout] = self.step_time("prefill", layout, StepBatch((ref,) * layout.dp)).total_s
        more = self.step_time(
            "prefill", layout, StepBatch((with_prompt,) + (ref,) * (layout.dp - 1))
        ).total_s
        value = max(more - base, 0.0)
        if len(self._estimates) > 100_000:
            self._estimates.clear()
        self._estimates[key] = value
        return value


def _overlapped_pass(serial: tuple, a: tuple, b: tuple, layers: int, host: float = 0.0) -> tuple:
    """overlap.overlapped of a one-token draft pass given as (total_s, dispatch_combine, busy) for
    its serial step and halves: (total_s, rank_busy_s, hidden_s), the same arithmetic (the second
    half's host work, `host` where it has any, paid once)."""
    total_s, dc, busy = serial
    if dc <= 0.0:
        return (total_s, busy, {})
    t_a, m_a, busy_a = a
    t_b, m_b, busy_b = b
    if t_b > 0.0:
        t_b -= host
    total = overlap_total(t_a, m_a, t_b, m_b, layers, total_s)
    if total is None:
        return (total_s, busy, {})
    exposed = total - ((t_a - m_a) + (t_b - m_b))
    both = tuple(min(x + y, total) for x, y in zip(busy_a, busy_b, strict=True))
    return (total, both, {OVERLAPPED: m_a + m_b - exposed})


def per_token(spec: StepCost) -> StepCost:
    """A speculative step per accepted token (every component divided by them)."""
    return _scaled(spec, 1.0 / spec.accepted_tokens)


def _scaled(cost: StepCost, per: float) -> StepCost:
    """`cost` with every time times `per` (a speculative step per accepted token)."""
    return StepCost(
        cost.total_s * per,
        {k: v * per for k, v in cost.breakdown.items()},
        tuple(b * per for b in cost.rank_busy_s),
        cost.bound,
        {k: v * per for k, v in cost.hidden_s.items()},
    )
