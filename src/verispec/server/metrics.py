"""The Prometheus sink of the server's metrics, under vLLM's names and meanings so existing
dashboards work unchanged (one registry per app, so several apps can live in one process).

Request figures are data (`RequestMetrics`); this sink adds each request's figures when it
leaves the engine (finished, aborted or failed):

    vllm:num_requests_running / vllm:num_requests_waiting        gauges, read at scrape time
    vllm:prompt_tokens_total / vllm:generation_tokens_total      counters
    vllm:request_success_total{finished_reason}                  counter (stop, length, abort)
    vllm:time_to_first_token_seconds                             histogram, queue time included
    vllm:time_per_output_token_seconds                           histogram, after the first token
    vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds
    vllm:spec_decode_num_drafts_total                            steps that verified >= 1 draft token
    vllm:spec_decode_num_draft_tokens_total                      draft tokens verified
    vllm:spec_decode_num_accepted_tokens_total                   draft tokens accepted (and emitted)
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position} accepted draft tokens at each position
    vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total   prompt tokens looked up in the
                                                                 prefix cache, and found there (tokens)
    verispec:prefix_cache_bytes                                  memory the prefix cache holds
    verispec:kv_cache_bytes / verispec:open_sequences            memory held by live requests
    verispec:drafter_memory_bytes / verispec:drafter_cached_tokens   what the drafter keeps across
                                                                 requests (suffix decoding's store of earlier responses)
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from verispec.engine.scheduler import Handle

disable_created_metrics()  # no *_created series (vLLM does the same)

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry

        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for a place in the batch.", labels, registry=r)
        self.kv_bytes = Gauge("verispec:kv_cache_bytes", "Bytes held by the open sequences' KV caches.", labels, registry=r)
        self.open_seqs = Gauge("verispec:open_sequences", "Sequences holding a KV cache (target and drafter).", labels, registry=r)
        self.drafter_bytes = Gauge("verispec:drafter_memory_bytes",
                                   "Bytes the drafter keeps across requests besides KV caches (suffix decoding's store, estimated).",
                                   labels, registry=r)
        self.drafter_tokens = Gauge("verispec:drafter_cached_tokens", "Tokens the drafter keeps across requests (suffix decoding's store).",
                                    labels, registry=r)
        self.prefix_bytes = Gauge("verispec:prefix_cache_bytes", "Bytes the prefix cache holds.", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", labels, registry=r)
        self.success = Counter("vllm:request_success", "Requests that left the engine.", labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token after the first.", labels, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency, queue included.", labels, buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time waiting for the batch.", labels, buckets=LATENCY_BUCKETS, registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Verification steps with at least one draft token.", labels, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", labels, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", labels, registry=r)
        self.accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens per draft position.", labels + ["position"], registry=r
        )

    def bind(self, num_running: Callable[[], int], num_waiting: Callable[[], int], kv_bytes: Callable[[], int], open_seqs: Callable[[], int],
             drafter_bytes: Callable[[], int] = lambda: 0, drafter_tokens: Callable[[], int] = lambda: 0,
             prefix_bytes: Callable[[], int] = lambda: 0) -> None:
        """Gauges read the engine's state at scrape time."""
        self.prefix_bytes.labels(self.model_name).set_function(prefix_bytes)
        self.running.labels(self.model_name).set_function(num_running)
        self.waiting.labels(self.model_name).set_function(num_waiting)
        self.kv_bytes.labels(self.model_name).set_function(kv_bytes)
        self.open_seqs.labels(self.model_name).set_function(open_seqs)
        self.drafter_bytes.labels(self.model_name).set_function(drafter_bytes)
        self.drafter_tokens.labels(self.model_name).set_function(drafter_tokens)

    def on_retire(self, handle: Handle) -> None:
        """A request left the engine (engine thread): add its figures."""
        m = handle.metrics
        name = self.model_name
        self.success.labels(name, handle.finish_reason or "error").inc()
        if handle.req is None:  # never started (aborted while waiting, or refused at prefill)
            return
        n_out = len(handle.req.output_ids)
        self.prompt_tokens.labels(name).inc(m.num_prompt_tokens)
        if m.num_cached_prompt_tokens is not None:
            self.prefix_queries.labels(name).inc(m.num_prompt_tokens)
            self.prefix_hits.labels(name).inc(m.num_cached_prompt_tokens)
        self.generation_tokens.labels(name).inc(n_out)
        self.ttft.labels(name).observe(m.queue_time + m.time_to_first_token)
        if n_out > 1:
            self.tpot.labels(name).observe((m.total_time - m.time_to_first_token) / (n_out - 1))
        self.e2e.labels(name).observe(m.queue_time + m.total_time)
        self.queue.labels(name).observe(m.queue_time)
        if m.num_drafts:
            self.drafts.labels(name).inc(m.num_drafts)
            self.draft_tokens.labels(name).inc(m.num_draft_tokens)
            self.accepted.labels(name).inc(m.num_accepted_tokens)
            for pos, count in enumerate(m.accepted_per_position):
                self.accepted_per_pos.labels(name, str(pos)).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
