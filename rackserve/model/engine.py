"""One rank's inference engine: admits requests, schedules prefill chunks and decode, runs the model.

API (what the live prefill/decode workers use; call rackserve.model.threads.limit_blas_threads(1)
once per process first: the small matrices run faster on one BLAS thread):
- `Engine.from_deployment(config, engram=None, publisher=None, on_event=None)`: everything from
  rackserve.config's `engine` + `engram` sections (`Engine.from_config(model_cfg, ...)` for tests).
  Weights come from the seed; the Engram table defaults to the in-process `LocalEngramTable`
  (the Engram service's gRPC client implementing `EngramTable` can be passed instead).
- `cached_prefix_tokens(token_ids) -> int`: tokens of the longest locally cached prefix (whole
  blocks; not capped), for routing / pool look-ups.
- `add_request(request_id, prompt_ids, params, output_ids=(), kv_blocks=()) -> Admission`:
  validates input (ValueError naming the parameter; a request that could not fit the cache even
  alone is refused), imports `kv_blocks` ([(block_hash, bytes)], chained hashes of the prompt's
  leading full blocks, e.g. fetched from the KV pool) into the cache and queues the request; raises
  rackserve.sched.QueueFull when `max_queue` requests are already here. When the request is first
  scheduled it reuses the longest cached prefix, capped so that at least the last token is computed.
- `step() -> StepResult`: one step of the rank's scheduler (rackserve.sched.RankScheduler, the same
  one the simulator runs): decode steps first, then chunked prefills within `max_num_batched_tokens`,
  at most `max_num_seqs` running; when blocks run out the newest running request is preempted
  (recompute) and resumes later. `StepResult.schedule` is the SchedulerOutput the step executed.
  Finished requests release their blocks (full ones stay cached).
- `export_prefix(token_ids) -> [(block_hash, bytes)]`: KV of the cached full blocks of a sequence
  (kv_codec format), e.g. for the pool after prefill. Call before later steps may evict them.
- `free(request_id)`: abort a request and release its blocks.
- `load() -> EngineLoad`: running/decoding requests, prompt tokens still to compute, free blocks.
- `StepResult.rank_batch()`: the step as the cost model's `RankBatch` (new and cached tokens per
  sequence), so a worker can pace the step with the simulated duration.
- `drain_events()`: stored/removed KVEvents (tier rank_hbm) unless `on_event` receives them.

P->D hand-off (the choice made here: recompute the tail). The prefill rank runs the prompt with
max_tokens=1, gets the first token, and exports the prompt's full blocks. The decode rank calls
`add_request(id, prompt, params, output_ids=[first_token], kv_blocks=blocks)`: it imports the full
blocks, recomputes the partial last block plus the first token (at most block_size tokens), and
samples token 2 at the same position with the same per-request seed, so it continues as if it had
prefilled itself (greedy: identical tokens; logits equal within float32 rounding).

Preemption (recompute, as vLLM v1): a preempted request keeps its tokens, loses its blocks (the full
ones stay cached until evicted), and recomputes what is gone when it resumes; its sampling seed and
positions are unchanged, so its outputs are exactly those of an uninterrupted run (greedy and seeded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from rackserve.config import Config
from rackserve.kv.block_cache import BlockCache, CacheStats
from rackserve.kv.block_hash import block_hashes, hash_block, root_hash
from rackserve.kv.events import KVEvent, Publisher
from rackserve.kv.kv_codec import encode_block
from rackserve.kv.paged_kv import PagedKV
from rackserve.model.config import ModelConfig
from rackserve.model.engine_request import EngineRequest
from rackserve.model.engram import (
    EngramTable,
    LocalEngramTable,
    engram_row_ids_windows,
    engram_windows,
)
from rackserve.model.kv_import import import_blocks
from rackserve.model.logits_processors import process_logits
from rackserve.model.sampling import SamplingParams, sample
from rackserve.model.tokenizer import EOS
from rackserve.model.transformer import Segment, Transformer
from rackserve.model.weights import init_weights
from rackserve.sched.kv_ledger import KVLedger
from rackserve.sched.limits import (
    DEFAULT_MAX_QUEUE,
    VLLM_MAX_NUM_BATCHED_TOKENS,
    VLLM_MAX_NUM_SEQS,
    SchedulerLimits,
)
from rackserve.sched.output import ScheduledSeq, SchedulerOutput
from rackserve.sched.scheduler import QueueFull, RankScheduler
from rackserve.sched.seq_state import SeqState
from rackserve.timing.batch import RankBatch

__all__ = [
    "Admission",
    "Engine",
    "EngineLoad",
    "EngineStats",
    "QueueFull",
    "StepResult",
    "TokenOutput",
]


@dataclass(frozen=True)
class Admission:
    request_id: str
    num_tokens: int  # prompt + given outputs
    num_cached_tokens: (
        int  # cached here at admission (local hit or imported), capped; reused when it starts
    )
    num_imported_blocks: int


@dataclass(frozen=True, eq=False)
class TokenOutput:
    """What one request did in a step."""

    request_id: str
    token: int | None  # sampled this step; None while a prefill chunk did not reach the end
    # float32 [vocab]: the model's logits at the token's position, before logit_bias, min_tokens
    # and the penalties shaped the draw (vLLM's default raw logprobs come from these)
    logits: np.ndarray | None = field(repr=False)
    finished: bool
    finish_reason: str | None  # "stop" (EOS) | "length" (max_tokens or context limit)
    num_computed_tokens: int  # computed for this request in this step
    num_cached_tokens: int  # reused from the cache when the request first started
    num_output_tokens: int
    # float32 [prompt tokens, vocab], row p the logits at position p, with the first token of a
    # request whose params ask prompt_logprobs
    prompt_logits: np.ndarray | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StepResult:
    outputs: tuple[TokenOutput, ...]
    num_prefill_tokens: int  # computed for requests that were not decoding
    num_decode_tokens: int
    num_seqs: int
    schedule: SchedulerOutput = field(default_factory=lambda: SchedulerOutput(0))

    @property
    def new_tokens(self) -> tuple[int, ...]:
        """Per scheduled sequence: tokens computed this step."""
        return self.schedule.new_tokens

    @property
    def context_before(self) -> tuple[int, ...]:
        """Per scheduled sequence: tokens already in KV before the step."""
        return tuple(s.num_computed_tokens for s in self.schedule.seqs)

    def rank_batch(self) -> RankBatch:
        """This step as the cost model's input (rackserve.timing.batch.RankBatch)."""
        return self.schedule.rank_batch()


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot for routing and admission decisions."""

    num_requests: int
    num_decoding: int
    pending_prefill_tokens: int  # prompt tokens admitted but not computed yet
    free_blocks: int
    num_waiting: int = 0  # admitted, not running (new, or preempted and waiting to resume)


@dataclass(frozen=True)
class EngineStats:
    computed_tokens: int
    reused_tokens: int
    imported_blocks: int
    cache: CacheStats
    num_preemptions: int = 0  # vllm:num_preemptions_total


class TokenIdentity:
    """A block's identity from the request's real tokens (rackserve.kv.block_hash's chain)."""

    def __init__(self, requests: dict[str, EngineRequest], block_size: int, root: int) -> None:
        self._requests, self._bs, self._root = requests, block_size, root

    def block(self, seq: SeqState, index: int, parent: int | None) -> tuple[int, list[int]]:
        tokens = self._requests[seq.req_id].token_ids[index * self._bs : (index + 1) * self._bs]
        return hash_block(self._root if parent is None else parent, tokens), tokens


class Engine:
    """Requests in, tokens out, for one rank with its own paged KV, block cache and scheduler."""

    def __init__(
        self,
        cfg: ModelConfig,
        transformer: Transformer,
        num_blocks: int,
        max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS,
        max_num_seqs: int = VLLM_MAX_NUM_SEQS,
        max_queue: int = DEFAULT_MAX_QUEUE,
        publisher: Publisher | None = None,
        on_event: Callable[[KVEvent], None] | None = None,
    ) -> None:
        if min(max_num_batched_tokens, max_num_seqs, max_queue) <= 0:
            raise ValueError("max_num_batched_tokens, max_num_seqs and max_queue must be positive")
        self.cfg = cfg
        self.model = transformer
        self.kv = PagedKV(cfg.n_layers, num_blocks, cfg.block_size, cfg.head_dim)
        self.cache = BlockCache(num_blocks, cfg.block_size, publisher, on_event)
        self._root = root_hash(cfg.model_id)
        self._requests: dict[str, EngineRequest] = {}
        self.ledger = KVLedger(
            self.cache, TokenIdentity(self._requests, cfg.block_size, self._root)
        )
        limits = SchedulerLimits(max_num_batched_tokens, max_num_seqs, max_queue)
        self.scheduler = RankScheduler(limits, kv=self.ledger)
        self._computed = self._reused = self._imported = 0

    @property
    def chunk_tokens(self) -> int:
        """The token budget of a step (vLLM max_num_batched_tokens)."""
        return self.scheduler.limits.max_num_batched_tokens

    @classmethod
    def from_deployment(
        cls,
        config: Config,
        engram: EngramTable | None = None,
        publisher: Publisher | None = None,
        on_event: Callable[[KVEvent], None] | None = None,
    ) -> Engine:
        """An engine shaped by the deployment config's `engine` and `engram` sections."""
        e = config.engine
        return cls.from_config(
            ModelConfig.from_sections(e, config.engram),
            engram,
            num_blocks=e.cache_blocks_per_rank,
            max_num_batched_tokens=e.max_num_batched_tokens,
            max_num_seqs=e.max_num_seqs,
            max_queue=e.max_queue_seqs,
            publisher=publisher,
            on_event=on_event,
        )

    @classmethod
    def from_config(
        cls,
        cfg: ModelConfig,
        engram: EngramTable | None = None,
        num_blocks: int = 4096,
        **kwargs: object,
    ) -> Engine:
        table = engram if engram is not None else LocalEngramTable(cfg)
        return cls(cfg, Transformer(cfg, init_weights(cfg), table), num_blocks, **kwargs)

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def load(self) -> EngineLoad:
        decoding = sum(1 for r in self._requests.values() if r.is_decoding)
        pending = sum(r.seq.pending for r in self._requests.values() if not r.is_decoding)
        waiting = len(self.scheduler.waiting)
        return EngineLoad(len(self._requests), decoding, pending, self.cache.num_free, waiting)

    def stats(self) -> EngineStats:
        return EngineStats(
            self._computed,
            self._reused,
            self._imported,
            self.cache.stats(),
            self.scheduler.num_preemptions,
        )

    def drain_events(self) -> list[KVEvent]:
        return self.cache.drain_events()

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        hashes, blocks = self._chain(token_ids)
        return len(self.cache.match_prefix(hashes, blocks)) * self.cfg.block_size

    def export_prefix(self, token_ids: Sequence[int]) -> list[tuple[int, bytes]]:
        hashes, blocks = self._chain(token_ids)
        found = self.cache.match_prefix(hashes, blocks)
        return [
            (h, encode_block(*self.kv.read_block(b), self.cfg.fingerprint))
            for h, b in zip(hashes, found, strict=False)
        ]

    # -- admission ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        output_ids: Sequence[int] = (),
        kv_blocks: Sequence[tuple[int, bytes]] = (),
    ) -> Admission:
        tokens = self._validate(request_id, prompt_ids, output_ids, params)
        if len(self.scheduler) >= self.scheduler.limits.max_queue:
            raise QueueFull(f"rank queue full: {len(self.scheduler)} requests admitted")
        hashes, blocks = self._chain(tokens)
        held, imported = import_blocks(self.cfg, self.cache, self.kv, hashes, blocks, kv_blocks)
        self.cache.release(held)
        self._imported += imported
        usable = (len(tokens) - 1) // self.cfg.block_size  # the last token is always computed
        cached = min(len(self.cache.match_prefix(hashes, blocks)), usable) * self.cfg.block_size
        seed = params.seed if params.seed is not None else xxhash.xxh64_intdigest(request_id) >> 1
        seq = SeqState(request_id, len(tokens), params.max_tokens - len(output_ids))
        request = EngineRequest(request_id, tokens, len(prompt_ids), params, seed, seq)
        if params.prompt_logprobs is not None and not output_ids:
            # every prompt position's logits are needed: none may come from the cache
            seq.reuse_prefix, cached = False, 0
            request.prompt_logits = np.zeros((len(prompt_ids), self.cfg.vocab_size), np.float32)
        self._requests[request_id] = request
        assert self.scheduler.admit(seq)
        return Admission(request_id, len(tokens), cached, imported)

    def free(self, request_id: str) -> None:
        """Abort: release the request's blocks (full ones stay cached)."""
        if self._requests.pop(request_id, None) is None:
            raise ValueError(f"request_id {request_id!r} is not running")
        self.scheduler.abort(request_id)

    def _validate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        params: SamplingParams,
    ) -> list[int]:
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already running")
        if len(prompt_ids) == 0:
            raise ValueError("prompt_ids must not be empty")
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        tokens = [int(t) for t in (*prompt_ids, *output_ids)]
        if min(tokens) < 0 or max(tokens) >= self.cfg.vocab_size:
            bad = next(t for t in tokens if not 0 <= t < self.cfg.vocab_size)
            raise ValueError(f"prompt_ids: token id {bad} outside [0, {self.cfg.vocab_size})")
        if len(tokens) >= self.cfg.max_context:
            raise ValueError(
                f"prompt_ids: {len(tokens)} tokens leave no room below max_context {self.cfg.max_context}"
            )
        if params.logit_bias and max(t for t, _ in params.logit_bias) >= self.cfg.vocab_size:
            bad = max(t for t, _ in params.logit_bias)
            raise ValueError(f"logit_bias: token id {bad} outside [0, {self.cfg.vocab_size})")
        if len(output_ids) >= params.max_tokens:
            raise ValueError(
                f"output_ids: {len(output_ids)} tokens already reach max_tokens {params.max_tokens}"
            )
        longest = min(self.cfg.max_context, len(prompt_ids) + params.max_tokens)
        need = -(-longest // self.cfg.block_size)
        if need > self.cache.num_blocks:
            raise ValueError(
                f"prompt_ids: up to {longest} tokens need {need} KV blocks; the cache has "
                f"{self.cache.num_blocks}, so the request could never finish"
            )
        return tokens

    def _chain(self, token_ids: Sequence[int]) -> tuple[list[int], list[list[int]]]:
        bs = self.cfg.block_size
        tokens = [int(t) for t in token_ids]
        hashes = block_hashes(tokens, bs, self.cfg.model_id)
        return hashes, [tokens[i * bs : (i + 1) * bs] for i in range(len(hashes))]

    # -- stepping ----------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Run one step of the scheduler's output; sample where a request's computed tokens caught up."""
        plan = self.scheduler.schedule()
        if plan.empty:
            return StepResult((), 0, 0, 0, plan)
        requests = [self._requests[s.req_id] for s in plan.seqs]
        decode = sum(1 for r, s in zip(requests, plan.seqs, strict=True) if _is_decode(r, s))
        logits = self._forward(plan, requests)
        outputs = tuple(
            self._advance(r, s, row) for r, s, row in zip(requests, plan.seqs, logits, strict=True)
        )
        finished = [o.request_id for o in outputs if o.finished]
        self.scheduler.update(plan, finished)
        for request_id in finished:
            del self._requests[request_id]
        total = plan.total_new_tokens
        self._computed += total
        return StepResult(outputs, total - decode, decode, len(plan.seqs), plan)

    def generate(
        self, requests: Sequence[tuple[str, Sequence[int], SamplingParams]]
    ) -> dict[str, list[int]]:
        """Convenience: add all, step until done, return each request's output tokens."""
        out: dict[str, list[int]] = {}
        for request_id, prompt, params in requests:
            self.add_request(request_id, prompt, params)
            out[request_id] = []
        while self.has_unfinished():
            for o in self.step().outputs:
                if o.token is not None and o.request_id in out:
                    out[o.request_id].append(o.token)
        return out

    def _forward(self, plan: SchedulerOutput, requests: list[EngineRequest]) -> np.ndarray:
        """Logits of each scheduled sequence's last new token; a request that keeps its prompt's
        logits (prompt_logprobs) gets those of every prompt token it computed stored too."""
        segments = self._segments(plan, requests)
        keep = [
            r.prompt_logits is not None and s.num_computed_tokens < r.num_prompt_tokens
            for r, s in zip(requests, plan.seqs, strict=True)
        ]
        if not any(keep):
            return self.model.forward(self.kv, segments)
        sizes = np.asarray(plan.new_tokens, np.int64)
        ends = np.cumsum(sizes)
        rows = np.concatenate(
            [np.arange(e - n, e) if k else [e - 1] for e, n, k in zip(ends, sizes, keep, strict=True)]
        )
        every = self.model.forward(self.kv, segments, rows)
        last, at = [], 0
        for r, s, k in zip(requests, plan.seqs, keep, strict=True):
            if not k:
                last.append(every[at])
                at += 1
                continue
            a, n = s.num_computed_tokens, s.num_new_tokens
            b = min(a + n, r.num_prompt_tokens)
            r.prompt_logits[a:b] = every[at : at + b - a]
            last.append(every[at + n - 1])
            at += n
        return np.stack(last)

    def _segments(self, plan: SchedulerOutput, requests: list[EngineRequest]) -> list[Segment]:
        """The batch for the model; Engram row ids of all new tokens are hashed in one call."""
        spans = [
            (s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens) for s in plan.seqs
        ]
        windows = [
            engram_windows(r.token_ids, a, b, self.cfg)
            for r, (a, b) in zip(requests, spans, strict=True)
        ]
        rows = np.split(
            engram_row_ids_windows(np.concatenate(windows), self.cfg),
            np.cumsum([b - a for a, b in spans])[:-1],
        )
        return [
            Segment(
                np.asarray(r.token_ids[a:b], np.int64),
                a,
                np.asarray(self.ledger.block_ids(r.request_id), np.int64),
                seg_rows,
            )
            for r, (a, b), seg_rows in zip(requests, spans, rows, strict=True)
        ]

    def _advance(self, request: EngineRequest, s: ScheduledSeq, logits: np.ndarray) -> TokenOutput:
        """Sample if the step caught up with the request's tokens; decide whether it finished.
        (The scheduler's `update` then counts the tokens and caches the newly full blocks.)"""
        if request.num_cached is None:  # first step: the prefix it started from
            request.num_cached = s.num_computed_tokens
            self._reused += s.num_computed_tokens
        token, prompt_logits = None, None
        if s.num_computed_tokens + s.num_new_tokens == len(request.token_ids):
            shaped = self._shaped(request, logits)
            token = sample(shaped, request.params, request.seed, len(request.token_ids))
            prompt_logits, request.prompt_logits = request.prompt_logits, None
            request.token_ids.append(token)
            request.finish_reason = self._finish_reason(request, token)
        return TokenOutput(
            request.request_id,
            token,
            logits if token is not None else None,
            request.finish_reason is not None,
            request.finish_reason,
            s.num_new_tokens,
            request.num_cached,
            request.num_outputs,
            prompt_logits,
        )

    def _shaped(self, request: EngineRequest, logits: np.ndarray) -> np.ndarray:
        """The logits the request's next token is drawn from (logit_bias, min_tokens, penalties)."""
        if not request.params.shapes_logits:
            return logits
        prompt = request.token_ids[: request.num_prompt_tokens]
        return process_logits(logits, request.params, prompt, request.output_ids, (EOS,))

    def _finish_reason(self, request: EngineRequest, token: int) -> str | None:
        if token == EOS and not request.params.ignore_eos:
            return "stop"
        if (
            request.num_outputs >= request.params.max_tokens
            or len(request.token_ids) >= self.cfg.max_context
        ):
            return "length"
        return None


def _is_decode(request: EngineRequest, s: ScheduledSeq) -> bool:
    """A one-token step of a request that already has outputs (not a prefill chunk)."""
    return s.num_new_tokens == 1 and request.num_outputs > 0
