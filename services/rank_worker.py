"""One DP rank as a Ray actor: its own Engine (paged KV, block cache, queue, batch), stepped by the
instance loop of its service process.

Prefill ranks reuse their HBM cache, then the KV pool, compute the rest, write the prompt's new
full blocks to the pool (leased until the decode rank has read them) and return the first token.
Decode ranks import a prompt's blocks from the pool by handle, recompute the partial tail and
decode. Every step is charged the tokens its engine computed. Both publish their cache's KV events
(tier rank_hbm) to the Redis Stream the router follows, from a thread of their own
(services/event_pump.py). Requests arrive on the step call (services/rank_inbox.py).
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import redis

from rackserve.config import Config
from rackserve.kv.block_hash import block_hashes
from rackserve.kv.events import Publisher
from rackserve.kv.kv_codec import encode_block
from rackserve.model.config import ModelConfig
from rackserve.model.engine import Engine
from rackserve.model.logprobs import TokenLogprob, token_logprob
from rackserve.model.mock_engine import MockEngine
from rackserve.model.sampling import SamplingParams
from rackserve.sched.scheduler import QueueFull
from rackserve.timing.batch import RankBatch
from services.engram.client import ShardedEngramTable
from services.event_pump import EventPump
from services.kv_link import Handle, PoolLink
from services.kvpool.client import Reservation
from services.rank_inbox import FAILED, INVALID, QUEUE_FULL, AdmitResult, Admitted, Submission

log = logging.getLogger(__name__)
REDIS_TIMEOUT_S = 1.0  # a hung Redis holds the event pump (never a step) this long per send


@dataclass(frozen=True)
class Emitted:
    """One request's progress in one step."""

    request_id: str
    token: int | None
    finish_reason: str | None  # None while running
    kv_block_hashes: tuple[int, ...] = ()  # prefill: the prompt's full blocks now in the pool
    reused: Admitted | None = None  # prefill, when finished: what the engine really started from
    kv_lease_id: int = 0  # prefill: the pool lease over kv_block_hashes the decode rank releases
    kv_block_tiers: tuple[str, ...] = ()  # prefill: their pool tiers as leased (empty: unknown)
    logprob: TokenLogprob | None = None  # the token's, when the request asked for logprobs
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # prefill: prompt tokens 1.., when asked


@dataclass(frozen=True)
class RankStep:
    batch: RankBatch
    emitted: tuple[Emitted, ...]
    busy: bool  # the rank still has requests
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    waiting: int = 0  # requests admitted but not in this step's batch
    queued_prompt_tokens: int = 0  # prompt tokens not computed yet
    preemptions: int = 0  # requests preempted (recompute) in this step
    wall_s: float = 0.0  # the call's wall time inside the actor (the rest of the call is Ray's)
    admitted: tuple[AdmitResult, ...] = ()  # one per submission the call carried, in order
    admit_s: float = 0.0  # of wall_s, the admissions' (pool lookup or hand-off read, import)


@dataclass(frozen=True)
class RankState:
    """A rank's load right now (its gauges are set from this, not from step deltas), and where
    it runs and when it last stepped (/admin/ranks)."""

    running: int
    waiting: int
    queued_prompt_tokens: int
    kv_blocks_used: int
    kv_blocks_total: int
    node: str = ""
    pid: int = 0
    steps: int = 0
    last_step_unix_s: float = 0.0  # 0: no step yet


@dataclass
class _Seq:
    prompt: list[int]
    pool_hbm: int = 0
    pool_dram: int = 0
    charged: bool = False
    local: int = 0  # HBM hit tokens found at admission
    reused: Admitted | None = None  # set at the request's first step
    hands_off: bool = False  # prefill: a decode rank will read the prompt's KV from the pool
    reservation: Future | None = None  # prefill: pool space booked for its blocks while computing
    top_logprobs: int | None = None  # alternatives per token's logprob; None: no logprobs asked
    prompt_top_logprobs: int | None = None  # prefill: alternatives of the prompt's logprobs

    def started_from(self, computed_tokens: int) -> Admitted:
        """The tokens the engine started from (its schedule's computed tokens), by where their KV
        came from: this rank's HBM first, then the blocks fetched from each pool tier. Fewer than
        admission found when the cache evicted some before the request started."""
        local = min(self.local, computed_tokens)
        hbm = min(self.pool_hbm, computed_tokens - local)
        return Admitted(local, hbm, min(self.pool_dram, computed_tokens - local - hbm))


@dataclass
class RankWorker:
    """Plain class (tests may use it in-process); `RayRankWorker` is its actor form."""

    cfg: Config
    role: str
    instance: str
    rank: int
    redis_url: str
    pool_addr: str
    engram_addrs: list[str] = field(default_factory=list)
    engine: Engine = field(init=False)
    pool: PoolLink = field(init=False)

    def __post_init__(self) -> None:
        self.engine = self._make_engine()
        model = self.model = self.engine.cfg
        self.pool = PoolLink(self.pool_addr, owner=f"{self.instance}/{self.rank}")
        self._redis = redis.Redis.from_url(
            self.redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        self._seqs: dict[str, _Seq] = {}
        self._pump = EventPump(self._redis, Publisher(self.instance, self.rank))
        # One block in the pool's format weighs the same for every block of this model.
        self._block_bytes = (
            self.engine.pool_block_bytes
            if isinstance(self.engine, MockEngine)
            else len(encode_block(*self.engine.kv.read_block(0), model.fingerprint))
        )
        self._reserver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-reserve")
        self._steps, self._last_step_unix_s = 0, 0.0
        # The first line of the rank's log (Ray names the actor by __repr__ before it).
        print(self.summary(), file=sys.stderr, flush=True)

    def summary(self) -> str:
        """One line for the rank's log: who it is and what it runs (not the whole Config)."""
        t = self.cfg.timing
        return (
            f"rank {self.instance}/{self.rank} ({self.role}) pid {os.getpid()} on {platform.node()}: "
            f"engine {self.cfg.engine.kind}, {self.cfg.engine.model_id}, "
            f"{self.cfg.engine.cache_blocks_per_rank} KV blocks of {self.cfg.engine.block_size}, "
            f"timing {t.hardware}/{t.model}, time_scale {self.cfg.cluster.time_scale:g}"
        )

    def __repr__(self) -> str:  # Ray's log prefix of this actor: "(decode-tp8-0/0 pid=...)"
        return f"{self.instance}/{self.rank}"

    def _make_engine(self) -> Engine:
        """The engine `engine.kind` names: the small model (with the Engram shards when given), or
        the mock (rackserve/model/mock_engine.py: no model, no Engram)."""
        publisher = Publisher(self.instance, self.rank)
        if self.cfg.engine.kind == "mock":
            return MockEngine.from_deployment(self.cfg, publisher=publisher)
        model = ModelConfig.from_sections(self.cfg.engine, self.cfg.engram)
        eng = self.cfg.engine
        table = (
            ShardedEngramTable(self.engram_addrs, model, cache_rows=self.cfg.engram.cache_rows)
            if self.engram_addrs
            else None
        )
        return Engine.from_config(
            model,
            engram=table,
            num_blocks=eng.cache_blocks_per_rank,
            max_num_batched_tokens=eng.max_num_batched_tokens,
            max_num_seqs=eng.max_num_seqs,
            max_queue=eng.max_queue_seqs,
            publisher=publisher,
        )

    def ready(self) -> bool:
        """The health probe's question (services/rank_probe.py), answered on the actor's thread (a
        stopped or stuck rank does not answer at all): can this rank take work? Not when its KV
        cache leaked blocks: with no request left every block must be free again."""
        if self.engine.has_unfinished():
            return True
        cache = self.engine.stats().cache
        return cache.num_free == cache.num_blocks

    def state(self) -> RankState:
        load = self.engine.load()
        cache = self.engine.stats().cache
        return RankState(
            load.num_requests - load.num_waiting,
            load.num_waiting,
            load.pending_prefill_tokens,
            cache.num_blocks - cache.num_free,
            cache.num_blocks,
            platform.node(),
            os.getpid(),
            self._steps,
            self._last_step_unix_s,
        )

    # -- admission -----------------------------------------------------------------------------
    def submit_prefill(self, request_id: str, prompt: list[int], params: dict) -> Admitted:
        """Queue a prompt: reuse HBM blocks, fetch the next run of blocks from the pool."""
        bs = self.model.block_size
        hashes = block_hashes(prompt, bs, self.model.model_id)
        usable = (len(prompt) - 1) // bs  # the last prompt token is always computed
        local = min(self.engine.cached_prefix_tokens(prompt) // bs, usable)
        fetched = self.pool.fetch(hashes[local:usable])
        kv_blocks = [(h, b"") for h in hashes[:local]] + [(h, data) for h, data, _ in fetched]
        given = _prompt_split(prompt, params)
        sampling = SamplingParams(**_engine_params(params, len(given[1]), max_tokens=1))
        self.engine.add_request(request_id, given[0], sampling, given[1], kv_blocks=kv_blocks)
        hbm = sum(bs for _, _, tier in fetched if tier == "pool_hbm")
        dram = sum(bs for _, _, tier in fetched if tier == "pool_dram")
        hands_off = int(params.get("max_tokens", 0)) != 1  # the router decodes unless 1 token was asked
        # The pool's reservation for the blocks it will store runs on a thread while the engine
        # computes them: one round trip fewer between the compute and the reply.
        reservation = self._reserver.submit(self.pool.reserve, hashes, self._block_bytes) if hashes else None
        self._seqs[request_id] = _Seq(prompt, hbm, dram, local=local * bs, hands_off=hands_off,
                                      reservation=reservation, top_logprobs=_top_logprobs(params),
                                      prompt_top_logprobs=sampling.prompt_logprobs)
        return Admitted(local * bs, hbm, dram)

    def submit_decode(
        self,
        request_id: str,
        prompt: list[int],
        first_token: int,
        kv_hashes: list[int],
        params: dict,
        kv_lease_id: int = 0,
        kv_tiers: tuple[str, ...] = (),
    ) -> Admitted:
        """Join the batch after a P->D hand-off: import the prompt's blocks from the pool, then
        release the prefill's lease over them (`kv_lease_id`, 0 = none). With their tiers as
        leased (`kv_tiers`, one per hash) the bytes are read from Redis without a pool lookup."""
        bs = self.model.block_size
        local = self.engine.cached_prefix_tokens(prompt) // bs
        local = min(local, len(kv_hashes))
        tiers = kv_tiers[local:] if len(kv_tiers) == len(kv_hashes) else ()
        fetched = self.pool.fetch(kv_hashes[local:], handoff_lease=kv_lease_id, handoff_tiers=tiers)
        kv_blocks = [(h, b"") for h in kv_hashes[:local]] + [(h, data) for h, data, _ in fetched]
        own, earlier = _prompt_split(prompt, params)
        sampling = SamplingParams(**_engine_params(params, len(earlier)))
        self.engine.add_request(
            request_id, own, sampling, output_ids=[*earlier, first_token], kv_blocks=kv_blocks
        )
        hbm = sum(bs for _, _, tier in fetched if tier == "pool_hbm")
        dram = sum(bs for _, _, tier in fetched if tier == "pool_dram")
        self._seqs[request_id] = _Seq(prompt, hbm, dram, local=local * bs,
                                      top_logprobs=_top_logprobs(params))
        return Admitted(local * bs, hbm, dram)

    def cancel(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self.engine.free(request_id)
            if seq.reservation is not None:
                seq.reservation.add_done_callback(self._abort_reservation)

    def _abort_reservation(self, done: Future) -> None:
        if done.exception() is None:
            self.pool.client.abort(done.result())

    def admit(self, submission: Submission) -> AdmitResult:
        """Apply one submission that rode on a step call; a refusal is answered, not raised (the
        other submissions and the step go on)."""
        s = submission
        try:
            if s.kind == "prefill":
                return AdmitResult(s.request_id, self.submit_prefill(s.request_id, list(s.prompt), s.params))
            if s.kind == "decode":
                admitted = self.submit_decode(
                    s.request_id, list(s.prompt), s.first_token, list(s.kv_hashes), s.params,
                    s.kv_lease_id, s.kv_tiers,
                )
                return AdmitResult(s.request_id, admitted)
            raise ValueError(f"kind: unknown submission kind {s.kind!r}")
        except QueueFull as exc:
            return AdmitResult(s.request_id, None, QUEUE_FULL, str(exc))
        except ValueError as exc:
            return AdmitResult(s.request_id, None, INVALID, str(exc))
        except Exception as exc:  # e.g. the pool did not answer: the router re-routes
            log.exception("%s/%d: admitting %s failed", self.instance, self.rank, s.request_id)
            return AdmitResult(s.request_id, None, FAILED, repr(exc))

    # -- stepping ------------------------------------------------------------------------------
    def step(self, inbox: tuple[Submission, ...] = ()) -> RankStep:
        """Admit what `inbox` carries (in order), then run one engine step."""
        started = time.perf_counter()
        admitted = tuple(self.admit(s) for s in inbox)
        admit_s = time.perf_counter() - started
        result = self.engine.step()
        self._steps, self._last_step_unix_s = self._steps + 1, time.time()
        new, cached, emitted = [], [], []
        pool_hbm = pool_dram = 0
        for out, planned in zip(result.outputs, result.schedule.seqs, strict=True):
            seq = self._seqs[out.request_id]
            # Charged = what the engine computed: a decode rank's first step recomputes the
            # prompt's partial last block (the hand-off moves full blocks, in the simulator too)
            # plus the first token, and any block the pool no longer had.
            new.append(out.num_computed_tokens)
            cached.append(planned.num_computed_tokens)
            if not seq.charged:  # pooled KV is fetched during the request's first step
                seq.reused = seq.started_from(planned.num_computed_tokens)
                pool_hbm, pool_dram, seq.charged = (
                    pool_hbm + seq.pool_hbm,
                    pool_dram + seq.pool_dram,
                    True,
                )
            emitted.append(self._emit(out))
        self._publish_events()
        stats = self.engine.stats().cache
        batch = RankBatch(
            np.asarray(new, np.int64), np.asarray(cached, np.int64), pool_hbm, pool_dram
        )
        load = self.engine.load()
        return RankStep(
            batch,
            tuple(emitted),
            self.engine.has_unfinished(),
            stats.num_blocks - stats.num_free,
            stats.num_blocks,
            max(0, self.engine.num_requests - len(new)),
            load.pending_prefill_tokens,
            len(result.schedule.preempted),
            time.perf_counter() - started,
            admitted,
            admit_s,
        )

    def _emit(self, out: object) -> Emitted:
        seq = self._seqs[out.request_id]
        logprob = None
        if seq.top_logprobs is not None and out.token is not None and out.logits is not None:
            logprob = token_logprob(out.logits, out.token, seq.top_logprobs)
        if not out.finished:
            return Emitted(out.request_id, out.token, None, logprob=logprob)
        del self._seqs[out.request_id]
        if self.role != "prefill":
            return Emitted(out.request_id, out.token, out.finish_reason, logprob=logprob)
        hold = seq.hands_off and out.finish_reason != "stop"  # EOS first: nobody decodes it
        handle = self._store_prompt(seq.prompt, hold, _result(seq.reservation))
        return Emitted(out.request_id, out.token, out.finish_reason, handle.hashes, seq.reused,
                       handle.lease_id, handle.tiers, logprob, self._prompt_logprobs(seq, out))

    def _prompt_logprobs(self, seq: _Seq, out: object) -> tuple[TokenLogprob, ...]:
        """Each prompt token's logprob after the first, from the logits at the position before."""
        if out.prompt_logits is None:
            return ()
        top = seq.prompt_top_logprobs or 0
        return tuple(
            token_logprob(out.prompt_logits[i - 1], seq.prompt[i], top)
            for i in range(1, len(seq.prompt))
        )

    def _store_prompt(self, prompt: list[int], hold: bool, reservation: Reservation | None) -> Handle:
        """Write the prompt's full blocks to the pool (those it lacks, into `reservation` where it
        covers them); returns the handle's hashes and, with `hold`, the lease keeping them for the
        decode rank and their tiers."""
        blocks = self.engine.export_prefix(prompt)
        return self.pool.store(blocks, hold=hold, reservation=reservation)

    def _publish_events(self) -> None:
        """Hand the step's KV events to the pump (services/event_pump.py): published in order on
        its thread, never within the step."""
        self._pump.send(self.engine.drain_events())


def _result(reservation: Future | None) -> Reservation | None:
    """The booked reservation (waiting for its call if still running), None if it failed."""
    if reservation is None:
        return None
    try:
        return reservation.result()
    except Exception:  # e.g. INVALID_ARGUMENT: store books anew, and reports that
        log.exception("pool reservation failed")
        return None


def _top_logprobs(params: dict) -> int | None:
    """Alternatives per token's logprob the wire params ask for; None when no logprobs."""
    return int(params.get("top_logprobs", 0)) if params.get("logprobs") else None


_ENGINE_KEYS = (
    "temperature", "top_p", "seed", "ignore_eos", "max_tokens", "logit_bias", "min_tokens",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "prompt_logprobs",
)


def _prompt_split(token_ids: list[int], params: dict) -> tuple[list[int], list[int]]:
    """(the request's own prompt, its earlier outputs) of the wire token ids (`prompt_tokens`)."""
    n = int(params.get("prompt_tokens") or 0)
    if not 0 < n < len(token_ids):
        return token_ids, []
    return token_ids[:n], token_ids[n:]


def _engine_params(params: dict, earlier: int = 0, **override: object) -> dict:
    """The engine's SamplingParams fields out of the wire message's (as a dict), with overrides.
    The wire's max_tokens and min_tokens count from the end of the token ids; the engine's from
    the end of the prompt, so `earlier` outputs of a migrated request are added to both."""
    fields = {k: params[k] for k in _ENGINE_KEYS if k in params}
    fields |= override
    for key in ("max_tokens", "min_tokens"):
        if fields.get(key):
            fields[key] = int(fields[key]) + earlier
    if earlier:
        fields["prompt_logprobs"] = None  # a migrated request has had its prompt's logprobs
    return fields
