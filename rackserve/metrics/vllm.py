"""vLLM's own metric names (labels model_name, engine), so a stock vLLM dashboard reads the twin.

Names, types, label sets and meanings follow vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py);
the buckets are rackserve's (simulated seconds of Rubin-scale steps are finer than vLLM's buckets).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rackserve.metrics.labels import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS, VLLM_LABELS
from rackserve.metrics.request_record import RequestRecord

# vLLM's FINISH_REASON_STRINGS (vllm/v1/engine/__init__.py): every engine gets a series of each.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
# vLLM's buckets of vllm:iteration_tokens_total (tokens per engine step).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def one_two_five(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(out)
            out.append(mantissa * scale)
        scale *= 10


# vLLM runs this ladder up to max_model_len; 1M tokens is past any context the twin serves.
REQUEST_TOKEN_BUCKETS = one_two_five(1_000_000)


class VllmMetrics:
    """vLLM's own names (labels model_name, engine) so a stock vLLM dashboard reads the twin."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        r = registry
        vl = list(VLLM_LABELS)

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, vl, buckets=buckets, registry=r)

        def counter(name: str, doc: str) -> Counter:  # exported as name + "_total"
            return Counter(name, doc, vl, registry=r)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.request_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*vl, "finished_reason"],
            registry=r,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            REQUEST_TOKEN_BUCKETS,
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            REQUEST_TOKEN_BUCKETS,
        )
        self.request_max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            REQUEST_TOKEN_BUCKETS,
        )
        self.iteration_tokens = histogram(  # vLLM's name: a histogram that ends in _total
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.num_requests_running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            vl,
            registry=r,
        )
        self.num_requests_waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            vl,
            registry=r,
        )
        self.kv_cache_usage_perc = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", vl, registry=r
        )
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        # vLLM's info gauge (always 1): its CacheConfig fields as labels, and engine; no model_name.
        self.cache_config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "enable_prefix_caching", "num_gpu_blocks", "engine"],
            registry=r,
        )

    def observe_request(self, rec: RequestRecord) -> None:
        """One finished request (a choice of n > 1 counts as one, as vLLM's child requests do),
        labelled with the engine that served its last token."""
        reason = rec.finished_reason
        if reason is None:  # refused at the door: never reached an engine
            return
        vl = self.declare_requests(rec.decode_engine)
        self.request_success.labels(**vl, finished_reason=reason).inc()
        self.generation_tokens.labels(**vl).inc(rec.output_tokens)
        for gap in rec.inter_token_s:
            self.inter_token.labels(**vl).observe(gap)
        if rec.ttft_s is None or rec.e2e_s is None:  # no first token: no prefill to time
            return
        self._observe_phases(rec, vl)

    def _observe_phases(self, rec: RequestRecord, vl: dict[str, str]) -> None:
        """vLLM's phases: queued (WAITING), prefill (scheduled to first token), decode (first to
        last token); inference = prefill + decode."""
        assert rec.ttft_s is not None and rec.e2e_s is not None
        prompt = rec.prompt_cached_tokens + rec.prompt_uncached_tokens
        prefill_s = max(0.0, rec.ttft_s - rec.queue_s)
        decode_s = max(0.0, rec.e2e_s - rec.ttft_s)
        self.prompt_tokens.labels(**vl).inc(prompt)
        self.ttft.labels(**vl).observe(rec.ttft_s)
        self.e2e.labels(**vl).observe(rec.e2e_s)
        self.queue_time.labels(**vl).observe(rec.queue_s)
        self.prefill_time.labels(**vl).observe(prefill_s)
        self.decode_time.labels(**vl).observe(decode_s)
        self.inference_time.labels(**vl).observe(prefill_s + decode_s)
        self.request_tpot.labels(**vl).observe(rec.tpot_s or 0.0)  # vLLM: 0 with < 2 tokens
        self.request_prompt_tokens.labels(**vl).observe(prompt)
        self.request_generation_tokens.labels(**vl).observe(rec.output_tokens)
        self.request_max_generation_tokens.labels(**vl).observe(rec.output_tokens)

    def declare_requests(self, engine: str) -> dict[str, str]:
        """The engine's request-level series, at zero until it serves one (vLLM makes every
        engine's series at start: a rate over a window that opens before the engine's first
        request then counts that request). Returns the engine's labels."""
        vl = {"model_name": self.model_name, "engine": engine}
        for metric in (
            self.ttft, self.inter_token, self.request_tpot, self.e2e, self.queue_time,
            self.inference_time, self.prefill_time, self.decode_time, self.prompt_tokens,
            self.generation_tokens, self.request_prompt_tokens, self.request_generation_tokens,
            self.request_max_generation_tokens,
        ):  # fmt: skip
            metric.labels(**vl)
        for reason in FINISHED_REASONS:
            self.request_success.labels(**vl, finished_reason=reason)
        return vl

    def declare_rank(self, engine: str, block_size: int, num_gpu_blocks: int) -> None:
        """A rank's engine-level series at zero, and its KV cache as vLLM's cache_config_info
        (label values as vLLM prints them)."""
        vl = {"model_name": self.model_name, "engine": engine}
        for metric in (
            self.iteration_tokens, self.prefix_cache_queries, self.prefix_cache_hits,
            self.num_preemptions,
        ):  # fmt: skip
            metric.labels(**vl)
        self.cache_config_info.labels(
            block_size=str(block_size),
            enable_prefix_caching="True",  # rackserve always reuses prefixes
            num_gpu_blocks=str(num_gpu_blocks),
            engine=engine,
        ).set(1)

    def observe_iteration(self, engine: str, tokens: int) -> None:
        """Tokens one engine (rank) computed in one step: prompt chunks plus sampled tokens."""
        if tokens > 0:
            self.iteration_tokens.labels(model_name=self.model_name, engine=engine).observe(tokens)
