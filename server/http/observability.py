"""Prometheus metrics of one server app, on an app-owned registry.

Every :class:`ServerMetrics` has its own ``CollectorRegistry`` (never prometheus_client's
global one), so several apps in one process (tests) keep separate counts. ``GET /metrics``
renders it in the Prometheus text format.

Series (token counts are per scored sequence, template included):

- ``rmserve_requests_total{endpoint, status}``: HTTP requests answered, by route and status.
- ``rmserve_request_duration_seconds{endpoint}``: request latency histogram (seconds).
- ``rmserve_groups_total`` / ``rmserve_sequences_total``: groups and sequences scored.
- ``rmserve_prompt_tokens_total``: tokens of all scored sequences (Σ ``num_tokens``).
- ``rmserve_prefix_cache_queries_total`` / ``rmserve_prefix_cache_hits_total``: tokens looked
  up in / served from the engine's prefix cache (Σ ``num_tokens`` / Σ ``num_cached_tokens``),
  the same definitions as vLLM's ``vllm:prefix_cache_queries`` / ``…_hits``, counted from
  the replies this server sent.
- ``rmserve_inflight_groups``: groups admitted by ``/v1/score`` and not yet answered
  (rendering or in the engine); what ``max_inflight_groups`` bounds.
- ``rmserve_checkpoint_swaps_total{kind, outcome}``: checkpoint swaps (``POST /v1/models/load``)
  that started draining, by kind (``reload``: weights into the running engine; ``restart``:
  the engine restarted on the checkpoint) and outcome (``ok``; ``error``: the engine failed;
  ``drain_timeout``: in-flight scoring outlasted ``swap_drain_timeout_s``, nothing loaded).
- ``rmserve_checkpoint_swap_duration_seconds{kind}``: time from drain start to the swapped
  model serving (seconds), successful swaps only.
- ``rmserve_engine_prefix_cache_queries_total`` / ``…_hits_total``: the engine's own
  cumulative counters, present only when the engine implements
  :class:`~rmserve.server.engines.protocol.SupportsPrefixCacheStats`.

Who asked (the ``user`` label is a user name of the users file, or ``anonymous`` on a server
without one, so the label's values are bounded by the users file; a refused request has no
user and is counted by reason only):

- ``rmserve_auth_rejections_total{reason}``: requests refused before any route ran, by reason
  (``missing``, ``malformed``, ``unknown``, ``expired``: 401; ``forbidden``: 403, a route the
  role may not use). Every reason is present from the start, at 0.
- ``rmserve_user_requests_total{user, endpoint, status}``: authenticated requests answered.
- ``rmserve_user_admitted_groups_total{user}`` / ``rmserve_user_prompt_tokens_total{user}``:
  groups admitted past the per-user limits, and their prompt tokens (Σ ``num_tokens`` of the
  sequences sent to the engine or answered from the result cache: what ``tokens_per_minute``
  counts).
- ``rmserve_user_inflight_groups{user}``: the user's groups admitted and not yet answered.
- ``rmserve_user_limit_rejections_total{user, limit}``: requests refused with 429 by a per-user
  limit (``max_inflight_groups`` or ``tokens_per_minute``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from rmserve.server.engines.protocol import PrefixCacheStats

AUTH_REJECT_REASONS: tuple[str, ...] = ("missing", "malformed", "unknown", "expired", "forbidden")
"""Values of the ``reason`` label of ``rmserve_auth_rejections_total`` (see
:data:`rmserve.server.sharing.auth.RejectReason`)."""

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
"""Upper bounds (seconds) of the request latency histogram buckets."""


class _EngineCounterCollector(Collector):
    """Reads the engine's counters at scrape time; yields nothing when it has none."""

    def __init__(self, read: Callable[[], PrefixCacheStats | None]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        counters = self._read()
        if counters is None:
            return
        queries = CounterMetricFamily(
            "rmserve_engine_prefix_cache_queries",
            "Tokens the engine looked up in its prefix cache (engine's own count).",
        )
        queries.add_metric([], float(counters.query_tokens))
        hits = CounterMetricFamily(
            "rmserve_engine_prefix_cache_hits",
            "Tokens the engine served from its prefix cache (engine's own count).",
        )
        hits.add_metric([], float(counters.hit_tokens))
        yield queries
        yield hits


class ServerMetrics:
    """The metric families of one app (see the module docstring for the series).

    Args:
        engine_counters: optional zero-argument callable returning the engine's
            :class:`~rmserve.server.engines.protocol.PrefixCacheStats` (or None when unavailable);
            read at each scrape.
    """

    def __init__(self, engine_counters: Callable[[], PrefixCacheStats | None] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rmserve_requests", "HTTP requests answered, by route and status.", ["endpoint", "status"], registry=r
        )
        self.request_duration_s = Histogram(
            "rmserve_request_duration_seconds",
            "Time from request start to reply, seconds.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.groups = Counter("rmserve_groups", "Groups scored by the engine.", registry=r)
        self.result_cache_hits = Counter(
            "rmserve_result_cache_hits", "Groups answered from the result cache (sent again; no engine work).", registry=r
        )
        self.sequences = Counter("rmserve_sequences", "Sequences (responses) scored.", registry=r)
        self.prompt_tokens = Counter("rmserve_prompt_tokens", "Tokens of all scored sequences.", registry=r)
        self.prefix_cache_queries = Counter(
            "rmserve_prefix_cache_queries", "Tokens looked up in the prefix cache (sum of num_tokens).", registry=r
        )
        self.prefix_cache_hits = Counter(
            "rmserve_prefix_cache_hits", "Tokens served from the prefix cache (sum of num_cached_tokens).", registry=r
        )
        self.inflight_groups = Gauge("rmserve_inflight_groups", "Groups admitted and not yet answered (rendering or in the engine).", registry=r)
        self.swaps = Counter(
            "rmserve_checkpoint_swaps",
            "Checkpoint swaps by kind (reload in place / engine restart) and outcome (ok / error / drain_timeout).",
            ["kind", "outcome"],
            registry=r,
        )
        self.swap_duration_s = Histogram(
            "rmserve_checkpoint_swap_duration_seconds",
            "Checkpoint swap time from drain start to serving the new checkpoint, seconds, by kind.",
            ["kind"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.auth_rejections = Counter(
            "rmserve_auth_rejections",
            "Requests refused before any route ran: 401 (missing, malformed, unknown, expired token) or 403 (forbidden: role).",
            ["reason"],
            registry=r,
        )
        for reason in AUTH_REJECT_REASONS:
            self.auth_rejections.labels(reason=reason)
        self.user_requests = Counter(
            "rmserve_user_requests", "Authenticated requests answered, by user, route and status.",
            ["user", "endpoint", "status"], registry=r,
        )
        self.user_groups = Counter(
            "rmserve_user_admitted_groups", "Groups admitted past the per-user limits, by user.", ["user"], registry=r
        )
        self.user_prompt_tokens = Counter(
            "rmserve_user_prompt_tokens", "Prompt tokens of the groups admitted (tokens_per_minute counts them), by user.",
            ["user"], registry=r,
        )
        self.user_inflight_groups = Gauge(
            "rmserve_user_inflight_groups", "The user's groups admitted and not yet answered.", ["user"], registry=r
        )
        self.user_limit_rejections = Counter(
            "rmserve_user_limit_rejections", "Requests refused (429) by a per-user limit, by user and limit.",
            ["user", "limit"], registry=r,
        )
        if engine_counters is not None:
            r.register(_EngineCounterCollector(engine_counters))

    def observe_user_request(self, user: str, endpoint: str, status: int) -> None:
        """Count one answered request of an authenticated ``user``."""
        self.user_requests.labels(user=user, endpoint=endpoint, status=str(status)).inc()

    def observe_request(self, endpoint: str, status: int, duration_s: float) -> None:
        """Count one answered request and its latency."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.request_duration_s.labels(endpoint=endpoint).observe(duration_s)

    def observe_group(self, num_tokens: Sequence[int], num_cached_tokens: Sequence[int]) -> None:
        """Count one scored group from its per-sequence token counts."""
        tokens = sum(num_tokens)
        self.groups.inc()
        self.sequences.inc(len(num_tokens))
        self.prompt_tokens.inc(tokens)
        self.prefix_cache_queries.inc(tokens)
        self.prefix_cache_hits.inc(sum(num_cached_tokens))

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of the registry, and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class NodeMetricsCollector:
    """Prometheus collector of a node: the node app's own families (requests, users,
    authentication; no ``model`` label) and every model app's families with a ``model``
    label added to each sample. A family both have is written once; the node's unlabelled
    samples of such a family (a counter the node never moves, e.g. ``rmserve_groups_total``)
    are left out, so that summing over ``model`` gives the node's total.

    Args:
        node: the node app's :class:`ServerMetrics`.
        per_model: each model's :class:`ServerMetrics` by the name it serves under (the
            ``model`` label), in the order given.
    """

    def __init__(self, node: ServerMetrics, per_model: dict[str, ServerMetrics]) -> None:
        self._node = node
        self._per_model = per_model

    def collect(self) -> Iterable:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        per_model = {name: list(metrics.registry.collect()) for name, metrics in self._per_model.items()}
        model_families = {fam.name for families in per_model.values() for fam in families}
        out: dict[str, Metric] = {}

        def family(source) -> Metric:
            if source.name not in out:
                out[source.name] = Metric(source.name, source.documentation, source.type, source.unit)
            return out[source.name]

        for fam in self._node.registry.collect():
            target = family(fam)
            for sample in fam.samples:
                if fam.name in model_families and not sample.labels:
                    continue
                target.samples.append(sample)
        for model, families in per_model.items():
            for fam in families:
                target = family(fam)
                for s in fam.samples:
                    target.samples.append(Sample(s.name, {**s.labels, "model": model}, s.value, s.timestamp, s.exemplar))
        yield from out.values()
