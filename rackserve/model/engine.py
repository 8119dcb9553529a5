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
  validates input (ValueError naming the parameter), imports `kv_blocks` ([(block_hash, bytes)],
  chained hashes of the prompt's leading full blocks, e.g. fetched from the KV pool), then reuses
  the longest cached prefix, capped so that at least the last token is computed.
- `step() -> StepResult`: one batch: every decoding request gets one token, then prefill chunks
  fill the token budget (`chunk_tokens`). Finished requests release their blocks (they stay cached).
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

Preemption is not implemented: a request waits while its blocks cannot be allocated, and `step`
raises RuntimeError when nothing at all fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from rackserve.config import Config
from rackserve.kv.block_cache import BlockCache, CacheStats
from rackserve.kv.block_hash import block_hashes, root_hash
from rackserve.kv.events import KVEvent, Publisher
from rackserve.kv.kv_codec import decode_block, encode_block
from rackserve.kv.paged_kv import PagedKV
from rackserve.model.config import ModelConfig
from rackserve.model.engine_request import EngineRequest
from rackserve.model.engram import (
    EngramTable,
    LocalEngramTable,
    engram_row_ids_windows,
    engram_windows,
)
from rackserve.model.sampling import SamplingParams, sample
from rackserve.model.tokenizer import EOS
from rackserve.model.transformer import Segment, Transformer
from rackserve.model.weights import init_weights
from rackserve.timing.batch import RankBatch


@dataclass(frozen=True)
class Admission:
    request_id: str
    num_tokens: int  # prompt + given outputs
    num_cached_tokens: int  # reused (local hit or imported), not computed
    num_imported_blocks: int


@dataclass(frozen=True, eq=False)
class TokenOutput:
    """What one request did in a step."""

    request_id: str
    token: int | None  # sampled this step; None while a prefill chunk did not reach the end
    logits: np.ndarray | None = field(repr=False)  # float32 [vocab] the token was drawn from
    finished: bool
    finish_reason: str | None  # "stop" (EOS) | "length" (max_tokens or context limit)
    num_computed_tokens: int  # computed for this request in this step
    num_cached_tokens: int  # reused at admission
    num_output_tokens: int


@dataclass(frozen=True)
class StepResult:
    outputs: tuple[TokenOutput, ...]
    num_prefill_tokens: int  # computed for requests that were not decoding
    num_decode_tokens: int
    num_seqs: int
    new_tokens: tuple[int, ...] = ()  # per scheduled sequence: tokens computed this step
    context_before: tuple[int, ...] = ()  # per scheduled sequence: tokens already in KV before

    def rank_batch(self) -> RankBatch:
        """This step as the cost model's input (rackserve.timing.batch.RankBatch)."""
        return RankBatch.of(list(self.new_tokens), list(self.context_before))


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot for routing and admission decisions."""

    num_requests: int
    num_decoding: int
    pending_prefill_tokens: int  # prompt tokens admitted but not computed yet
    free_blocks: int


@dataclass(frozen=True)
class EngineStats:
    computed_tokens: int
    reused_tokens: int
    imported_blocks: int
    cache: CacheStats


class Engine:
    """Requests in, tokens out, for one rank with its own paged KV and block cache."""

    def __init__(
        self,
        cfg: ModelConfig,
        transformer: Transformer,
        num_blocks: int,
        chunk_tokens: int = 512,
        max_batch_seqs: int = 64,
        publisher: Publisher | None = None,
        on_event: Callable[[KVEvent], None] | None = None,
    ) -> None:
        if chunk_tokens <= 0 or max_batch_seqs <= 0:
            raise ValueError("chunk_tokens and max_batch_seqs must be positive")
        self.cfg = cfg
        self.model = transformer
        self.kv = PagedKV(cfg.n_layers, num_blocks, cfg.block_size, cfg.head_dim)
        self.cache = BlockCache(num_blocks, cfg.block_size, publisher, on_event)
        self.chunk_tokens = chunk_tokens
        self.max_batch_seqs = max_batch_seqs
        self._root = root_hash(cfg.model_id)
        self._requests: dict[str, EngineRequest] = {}
        self._computed = self._reused = self._imported = 0

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
            chunk_tokens=e.prefill_chunk_tokens,
            max_batch_seqs=e.max_batch_seqs,
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
        pending = sum(r.num_pending for r in self._requests.values() if not r.is_decoding)
        return EngineLoad(len(self._requests), decoding, pending, self.cache.num_free)

    def stats(self) -> EngineStats:
        return EngineStats(self._computed, self._reused, self._imported, self.cache.stats())

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
        hashes, blocks = self._chain(tokens)
        imported_before = self._imported
        held = self._import(hashes, blocks, kv_blocks)
        found = self.cache.match_prefix(hashes, blocks)
        usable = found[
            : (len(tokens) - 1) // self.cfg.block_size
        ]  # the last token is always computed
        self.cache.acquire(usable)
        self.cache.release(held)
        self.cache.record_lookup(len(hashes), len(usable))
        seed = params.seed if params.seed is not None else xxhash.xxh64_intdigest(request_id) >> 1
        cached = len(usable) * self.cfg.block_size
        self._requests[request_id] = EngineRequest(
            request_id,
            tokens,
            len(prompt_ids),
            params,
            seed,
            list(usable),
            hashes[: len(usable)],
            cached,
            cached,
        )
        self._reused += cached
        return Admission(request_id, len(tokens), cached, self._imported - imported_before)

    def free(self, request_id: str) -> None:
        """Abort: release the request's blocks (full ones stay cached)."""
        request = self._requests.pop(request_id, None)
        if request is None:
            raise ValueError(f"request_id {request_id!r} is not running")
        self.cache.release(request.block_ids)

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
        if len(output_ids) >= params.max_tokens:
            raise ValueError(
                f"output_ids: {len(output_ids)} tokens already reach max_tokens {params.max_tokens}"
            )
        return tokens

    def _chain(self, token_ids: Sequence[int]) -> tuple[list[int], list[list[int]]]:
        bs = self.cfg.block_size
        tokens = [int(t) for t in token_ids]
        hashes = block_hashes(tokens, bs, self.cfg.model_id)
        return hashes, [tokens[i * bs : (i + 1) * bs] for i in range(len(hashes))]

    def _import(
        self, hashes: list[int], blocks: list[list[int]], kv_blocks: Sequence[tuple[int, bytes]]
    ) -> list[int]:
        """Write given blocks into the cache (those not cached yet); returns every block of the given
        prefix found or written, each holding one extra reference until admission is done.
        All blocks are checked and decoded before the cache changes, so a bad one changes nothing."""
        decoded = self._decode_imports(hashes, blocks, kv_blocks)
        held: list[int] = []
        for i, kv in enumerate(decoded):
            present = self.cache.find(hashes[i], blocks[i])
            if present is not None:  # hold it so importing the next blocks cannot evict it
                self.cache.acquire([present])
                held.append(present)
                continue
            if kv is None or self.cache.num_free == 0:
                break
            (block,) = self.cache.allocate(1)
            self.kv.write_block(block, *kv)
            self.cache.commit(block, hashes[i], blocks[i], hashes[i - 1] if i else None)
            held.append(block)
            self._imported += 1
        return held

    def _decode_imports(
        self, hashes: list[int], blocks: list[list[int]], kv_blocks: Sequence[tuple[int, bytes]]
    ) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """(K, V) per given block, None where the block is already cached here."""
        if len(kv_blocks) > len(hashes):
            raise ValueError(
                f"kv_blocks: {len(kv_blocks)} blocks for a sequence of {len(hashes)} full blocks"
            )
        shape = (self.cfg.n_layers, self.cfg.block_size, self.cfg.head_dim)
        decoded: list[tuple[np.ndarray, np.ndarray] | None] = []
        for i, (block_hash, data) in enumerate(kv_blocks):
            if block_hash != hashes[i]:
                raise ValueError(
                    f"kv_blocks[{i}]: hash {block_hash:#x} is not block {i} of the prompt"
                )
            if self.cache.find(block_hash, blocks[i]) is not None:
                decoded.append(None)
                continue
            try:
                decoded.append(decode_block(data, shape, self.cfg.fingerprint))
            except ValueError as exc:
                raise ValueError(f"kv_blocks[{i}]: {exc}") from None
        return decoded

    # -- stepping ----------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Schedule and run one batch; sample where a request's computed tokens caught up."""
        scheduled = self._schedule()
        if not scheduled:
            if self._requests:
                raise RuntimeError("KV cache too small: no request can get the blocks it needs")
            return StepResult((), 0, 0, 0)
        decode = sum(1 for r, _ in scheduled if r.is_decoding)
        total = sum(n for _, n in scheduled)
        before = tuple(r.num_computed for r, _ in scheduled)
        logits = self.model.forward(self.kv, self._segments(scheduled))
        outputs = tuple(
            self._advance(r, n, row) for (r, n), row in zip(scheduled, logits, strict=True)
        )
        self._computed += total
        new = tuple(n for _, n in scheduled)
        return StepResult(outputs, total - decode, decode, len(scheduled), new, before)

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

    def _schedule(self) -> list[tuple[EngineRequest, int]]:
        """Decoding requests first (one token each), then prefill chunks within the token budget."""
        budget = self.chunk_tokens
        chosen: list[tuple[EngineRequest, int]] = []
        ordered = sorted(self._requests.values(), key=lambda r: not r.is_decoding)  # stable
        for request in ordered:
            if len(chosen) == self.max_batch_seqs or budget == 0:
                break
            n = min(request.num_pending, budget)
            need = request.blocks_needed(n, self.cfg.block_size)
            if need > self.cache.num_free:
                continue
            request.block_ids += self.cache.allocate(need)
            chosen.append((request, n))
            budget -= n
        return chosen

    def _segments(self, scheduled: list[tuple[EngineRequest, int]]) -> list[Segment]:
        """The batch for the model; Engram row ids of all new tokens are hashed in one call."""
        windows = [
            engram_windows(r.token_ids, r.num_computed, r.num_computed + n, self.cfg)
            for r, n in scheduled
        ]
        rows = np.split(
            engram_row_ids_windows(np.concatenate(windows), self.cfg),
            np.cumsum([n for _, n in scheduled])[:-1],
        )
        return [
            Segment(
                np.asarray(r.token_ids[r.num_computed : r.num_computed + n], np.int64),
                r.num_computed,
                np.asarray(r.block_ids, np.int64),
                seg_rows,
            )
            for (r, n), seg_rows in zip(scheduled, rows, strict=True)
        ]

    def _advance(self, request: EngineRequest, n: int, logits: np.ndarray) -> TokenOutput:
        """Count computed tokens, cache newly full blocks, sample if caught up, finish if done."""
        request.num_computed += n
        for index, block_hash, parent, tokens in request.next_full_blocks(
            self.cfg.block_size, self._root
        ):
            self.cache.commit(request.block_ids[index], block_hash, tokens, parent)
        token = None
        if request.num_pending == 0:
            token = sample(logits, request.params, request.seed, len(request.token_ids))
            request.token_ids.append(token)
            request.finish_reason = self._finish_reason(request, token)
        if request.finish_reason is not None:
            self.free(request.request_id)
        return TokenOutput(
            request.request_id,
            token,
            logits if token is not None else None,
            request.finish_reason is not None,
            request.finish_reason,
            n,
            request.num_cached,
            request.num_outputs,
        )

    def _finish_reason(self, request: EngineRequest, token: int) -> str | None:
        if token == EOS and not request.params.ignore_eos:
            return "stop"
        if (
            request.num_outputs >= request.params.max_tokens
            or len(request.token_ids) >= self.cfg.max_context
        ):
            return "length"
        return None
