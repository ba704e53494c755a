"""What an operator watches a worker by: JSON log lines and Prometheus metrics.

Rules of this module:

- It observes; it never decides or writes.  Logs are made from the
  worker's structured timeline (:class:`~fencekeeper.adapters.worker.WorkerEvent`),
  metrics from the reports of its passes
  (:class:`~fencekeeper.adapters.worker.PassReport`) and, when scraped, from
  what the store holds (executions by state, expired leases).
- A JSON log line is one object: ``ts`` (UTC, ISO 8601), ``level``,
  ``event``, ``worker_id``, ``execution_id``, ``fence`` and ``code`` (the
  refusal or error code, or null), and ``detail``.  Nothing else is written
  to the stream the log uses, so a collector can parse every line.
- ``prometheus_client`` is optional (``pip install 'fencekeeper[metrics]'``)
  and imported only when metrics are asked for; every metric lives in a
  registry of its own, so that two workers in one process, or one test
  after another, never collide.
- OpenTelemetry is optional too (``pip install 'fencekeeper[tracing]'``):
  :class:`VisitSpans` makes one span per node visit when the API is
  installed, and the deployment's SDK, if it configured one, exports them
  (:func:`visit_spans` gives none where no provider is configured).
- A scrape that cannot read the store reports the pass counters it has and
  sets ``fencekeeper_store_up`` to 0, rather than failing the scrape.

The metrics (every counter counts since the process started):

==========================================  =====================================================
``fencekeeper_worker_claims_total``          executions claimed
``fencekeeper_worker_steps_total``           node visits committed
``fencekeeper_worker_refusals_total{code}``  kernel refusals met, by refusal code
``fencekeeper_worker_lease_renewals_total``  leases renewed
``fencekeeper_worker_timers_fired_total``    due one-time wakes fired
``fencekeeper_worker_finished_total{state}`` executions that left running, by the state they left for
``fencekeeper_worker_claim_seconds``         histogram: how long a claim that found work took
``fencekeeper_executions{state}``            executions in the store, by state (the queue depth), at scrape
``fencekeeper_expired_leases``               running executions whose lease has expired, at scrape
``fencekeeper_store_up``                     1 if the last scrape could read the store
==========================================  =====================================================

The spans (:class:`VisitSpans`): one ``fencekeeper.visit`` span per node
visit, from the end of the worker's previous commit on the execution (its
claim, renewal or previous visit) to the commit of this one, with the
attributes ``fencekeeper.execution_id``, ``fencekeeper.worker_id``,
``fencekeeper.fence``, ``fencekeeper.node_id`` and ``fencekeeper.outcome``
(``step``, the state it left for, or ``refused``); a Command issued during
the visit is a span event; a refused visit has status ERROR and
``fencekeeper.code``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from fencekeeper.kernel.common import shown
from fencekeeper.kernel.machines import ExecutionState

from .store import StoreError, TransactionalStore
from .worker import PassReport, WorkerEvent

CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Claim latency buckets, in seconds: a healthy store claims in milliseconds."""

_WARNINGS = frozenset({"refused", "malformed", "lapsed"})
_ERRORS = frozenset({"failed", "suspended", "reconciliation_required"})


class JsonLog:
    """Writes each :class:`WorkerEvent` as one JSON object on one line of ``stream`` (thread-safe)."""

    _lock = threading.Lock()
    """One for every log of the process: the worker's and the command line's library records share stderr."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __call__(self, event: WorkerEvent) -> None:
        """Write ``event``; a refusal is a warning, an execution leaving for failed or a review state an error."""
        level = "warning" if event.what in _WARNINGS else "error" if event.what in _ERRORS else "info"
        self.line(
            level,
            event.what,
            worker_id=event.worker_id,
            execution_id=event.execution_id,
            fence=event.fence,
            code=event.code,
            node_id=event.node_id,
            detail=event.detail,
        )

    def line(self, level: str, event: str, **fields: Any) -> None:
        """Write one log object (used for the worker's own notes: started, listening, stopped)."""
        record = {"ts": datetime.now(UTC).isoformat(), "level": level, "event": event, **fields}
        text = json.dumps(record, default=str, ensure_ascii=False)
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()


class MetricsUnavailable(Exception):
    """prometheus_client is not installed: metrics need the ``metrics`` extra."""


class WorkerMetrics:
    """The Prometheus metrics of the workers of one process, served over HTTP by :meth:`serve`."""

    def __init__(self, store: TransactionalStore) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram  # noqa: PLC0415 - optional extra
        except ImportError:
            raise MetricsUnavailable(
                "metrics need prometheus_client: pip install 'fencekeeper[metrics]'"
            ) from None
        self.store = store
        self.registry = CollectorRegistry()
        self.claims = Counter("fencekeeper_worker_claims", "Executions claimed.", registry=self.registry)
        self.steps = Counter("fencekeeper_worker_steps", "Node visits committed.", registry=self.registry)
        self.refusals = Counter(
            "fencekeeper_worker_refusals", "Kernel refusals met, by refusal code.", ["code"], registry=self.registry
        )
        self.renewals = Counter("fencekeeper_worker_lease_renewals", "Leases renewed.", registry=self.registry)
        self.timers = Counter("fencekeeper_worker_timers_fired", "Due one-time wakes fired.", registry=self.registry)
        self.finished = Counter(
            "fencekeeper_worker_finished",
            "Executions that left running, by the state they left for.",
            ["state"],
            registry=self.registry,
        )
        self.claim_seconds = Histogram(
            "fencekeeper_worker_claim_seconds",
            "How long a claim that found work took, store round trip included.",
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(store))
        self._server: Any = None

    def record(self, report: PassReport) -> None:
        """Count what one pass did."""
        self.claims.inc(len(report.claimed))
        self.steps.inc(report.steps)
        self.renewals.inc(report.renewals)
        self.timers.inc(report.timers_fired)
        for refused in report.refused:
            self.refusals.labels(code=refused.code).inc()
        for malformed in report.malformed:  # a damaged row passed over: code malformed_row, to alert on
            self.refusals.labels(code=malformed.code).inc()
        for state, count in report.finished.items():
            self.finished.labels(state=state).inc(count)
        for seconds in report.claim_seconds:
            self.claim_seconds.observe(seconds)

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the address bound (port 0: any free one)."""
        from prometheus_client import start_http_server  # noqa: PLC0415 - optional extra

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        bound_host, bound_port = server.server_address[:2]
        return str(bound_host), int(bound_port)

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _StoreCollector:
    """Read at every scrape: executions by state, expired leases, and whether the store answered."""

    def __init__(self, store: TransactionalStore) -> None:
        self.store = store

    def describe(self) -> list[Any]:
        # Empty: the registry must not call collect() (which reads the store) when this is registered.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional extra

        up = GaugeMetricFamily("fencekeeper_store_up", "1 if the last scrape could read the store.")
        try:
            counts = {state: len(self.store.execution_ids(state)) for state in ExecutionState}
            expired = len(self.store.expired())
        except StoreError:
            up.add_metric([], 0)
            yield up
            return
        depth = GaugeMetricFamily(
            "fencekeeper_executions", "Executions in the store, by state (the queue depth).", labels=["state"]
        )
        for state, count in counts.items():
            depth.add_metric([state.value], count)
        yield depth
        yield GaugeMetricFamily(
            "fencekeeper_expired_leases", "Running executions whose lease has expired.", value=expired
        )
        up.add_metric([], 1)
        yield up


class TracingUnavailable(Exception):
    """The OpenTelemetry API is not installed: spans need the ``tracing`` extra."""


_VISIT_ENDS = frozenset(
    {"step", "refused", "waiting", "succeeded", "failed", "suspended", "reconciliation_required", "cancelled"}
)


class VisitSpans:
    """One OpenTelemetry span per node visit, made from a worker's timeline (pass it as ``on_record``).

    ``tracer_provider`` defaults to the global one the deployment configured
    (a no-op without an SDK).  Thread-safe: one instance serves every worker
    of a process.
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry import trace  # noqa: PLC0415 - optional extra
        except ImportError:
            raise TracingUnavailable("spans need the OpenTelemetry API: pip install 'fencekeeper[tracing]'") from None
        self._trace = trace
        self.tracer = trace.get_tracer("fencekeeper.worker", tracer_provider=tracer_provider)
        self._since: dict[tuple[str, str], int] = {}
        self._commands: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self._lock = threading.Lock()

    def __call__(self, event: WorkerEvent) -> None:
        """Close the visit ``event`` ends (if it ends one), and remember where the next one starts."""
        import time  # noqa: PLC0415 - the clock of the spans only

        now = time.time_ns()
        key = (event.worker_id, event.execution_id)
        with self._lock:
            started = self._since.get(key, now)
            if event.what == "command":
                self._commands.setdefault(key, []).append((event.detail, now))
                return
            if event.what not in _VISIT_ENDS:
                self._since[key] = now  # claimed, renewed, timer: the next visit starts after this commit
                return
            commands = self._commands.pop(key, [])
            if event.what == "step":
                self._since[key] = now
            else:
                self._since.pop(key, None)
        attributes: dict[str, str | int] = {
            "fencekeeper.execution_id": event.execution_id,
            "fencekeeper.worker_id": event.worker_id,
            "fencekeeper.outcome": event.what,
        }
        if event.fence is not None:
            attributes["fencekeeper.fence"] = event.fence
        if event.node_id is not None:
            attributes["fencekeeper.node_id"] = event.node_id
        if event.code is not None:
            attributes["fencekeeper.code"] = event.code
        span = self.tracer.start_span("fencekeeper.visit", start_time=started, attributes=attributes)
        for detail, at in commands:
            span.add_event("command issued", {"fencekeeper.command": detail}, timestamp=at)
        if event.what == "refused":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, event.detail))
        span.end(end_time=now)


def visit_spans() -> VisitSpans | None:
    """:class:`VisitSpans` over the global tracer provider when one is configured now; None otherwise.

    None when the OpenTelemetry API is not installed, and when no provider
    has been set (in code, or by ``OTEL_PYTHON_TRACER_PROVIDER``): the API's
    proxy would then hand every span to a no-op tracer, and the timeline
    each span is made from would still cost a worker some 2% of an
    execution's CPU.  ``fencekeeper worker`` asks once its handler factory
    has run, so a provider set there, or when the handler's module is
    imported, gets the spans; one set later does not (a VisitSpans made
    directly follows the global provider whenever it is set).
    """
    # A provider is set by code that imported the API first (the SDK's setup, an
    # instrumentation's start-up), or named by OTEL_PYTHON_TRACER_PROVIDER.  With
    # neither, none can be configured, and importing the API only to ask would add
    # some 10 ms to the start-up of every worker command where it is installed.
    if "opentelemetry.trace" not in sys.modules and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ:
        return None
    try:
        from opentelemetry import trace  # noqa: PLC0415 - optional extra
    except ImportError:
        return None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return VisitSpans()


def fan_out(*sinks: Callable[[WorkerEvent], None] | None) -> Callable[[WorkerEvent], None] | None:
    """One ``on_record`` callback that hands each event to every sink given (None when none is)."""
    chosen = [sink for sink in sinks if sink is not None]
    if not chosen:
        return None

    def record(event: WorkerEvent) -> None:
        for sink in chosen:
            sink(event)

    return record


def parse_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` as (host, port); the host defaults to every interface, as Prometheus exporters do.

    Raises ValueError naming what is wrong.
    """
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{shown(text)}: give PORT or HOST:PORT, with PORT between 0 and 65535")
    return host, int(port)


__all__ = [
    "CLAIM_BUCKETS",
    "JsonLog",
    "MetricsUnavailable",
    "TracingUnavailable",
    "VisitSpans",
    "WorkerMetrics",
    "fan_out",
    "parse_address",
    "visit_spans",
]
