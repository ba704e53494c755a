"""What an operator watches, in process: one span per node visit, and the JSON log's lines.

Spans are recorded with the OpenTelemetry SDK's in-memory exporter; the
metrics endpoint and the log of a running ``fencekeeper worker`` are proved
in tests/cli/test_worker_observability.py.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fencekeeper
from fencekeeper.adapters import examples
from fencekeeper.adapters.observe import JsonLog, VisitSpans, fan_out, visit_spans
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.worker import PassReport, WorkerEvent
from fencekeeper.kernel import protocol as p

PURCHASE = Path(__file__).resolve().parents[2] / "adapters" / "workflows" / "purchase_approval.toml"


def recorder() -> tuple[VisitSpans, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return VisitSpans(provider), exporter


def test_one_span_per_node_visit_and_a_log_line_per_event(tmp_path: Path) -> None:
    spans, exporter = recorder()
    stream = io.StringIO()
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(str(tmp_path / "s.db"), policy=policy, handler=examples.handler()) as client:
        client.run(PURCHASE, {"amount": 10, "order_id": "o-1", "order_revision": 1}, execution_id="po-1")
        worker = client.worker("w-1", lease=5)
        worker.on_record = fan_out(spans, JsonLog(stream))
        report = worker.run_pass()
    assert report.steps == 3
    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == ["fencekeeper.visit"] * 3
    assert [s.attributes["fencekeeper.node_id"] for s in finished] == ["check_amount", "place_order", "done"]
    assert [s.attributes["fencekeeper.outcome"] for s in finished] == ["step", "step", "succeeded"]
    assert {s.attributes["fencekeeper.execution_id"] for s in finished} == {"po-1"}
    assert {s.attributes["fencekeeper.fence"] for s in finished} == {1}
    # Visits follow each other: each starts where the previous commit ended.
    for earlier, later in itertools.pairwise(finished):
        assert earlier.end_time is not None and later.start_time == earlier.end_time
    (place,) = [s for s in finished if s.attributes["fencekeeper.node_id"] == "place_order"]
    assert [e.name for e in place.events] == ["command issued"]
    assert all(s.status.status_code is StatusCode.UNSET for s in finished)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["event"] for r in lines] == ["claimed", "step", "command", "step", "succeeded"]
    assert all(r["worker_id"] == "w-1" and r["execution_id"] == "po-1" and r["fence"] == 1 for r in lines)
    assert lines[2]["node_id"] == "place_order"


def test_a_refused_visit_is_an_error_span_with_its_code(tmp_path: Path) -> None:
    spans, exporter = recorder()
    clock = ManualClock()
    policy = examples.grants("default", "user:operator")
    with fencekeeper.connect(str(tmp_path / "s.db"), policy=policy, handler=examples.handler(), clock=clock) as client:
        client.run(PURCHASE, {"amount": 10, "order_id": "o-1", "order_revision": 1}, execution_id="po-1")
        worker = client.worker("w-1", lease=timedelta(seconds=5))
        worker.on_record = spans
        claimed = client.store.claim_next(p.ClaimRequest("w-1", "t" * 32, worker.lease))
        assert isinstance(claimed, p.Decision) and claimed.lease is not None
        clock.advance(timedelta(seconds=6))  # the lease expires before the worker's first visit commits
        report = PassReport()
        worker.drive("po-1", claimed.lease, report)
    assert [r.code for r in report.refused] == ["lease_expired"]
    (span,) = exporter.get_finished_spans()
    assert span.attributes["fencekeeper.outcome"] == "refused"
    assert span.attributes["fencekeeper.code"] == "lease_expired"
    assert span.status.status_code is StatusCode.ERROR



def test_the_worker_makes_spans_only_where_a_tracer_provider_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a provider the API's proxy hands every span to a no-op tracer: fencekeeper worker then
    # makes none (visit_spans is None) rather than pay for the timeline they are made from.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    assert visit_spans() is None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    spans = visit_spans()
    assert spans is not None
    spans(WorkerEvent("w-1", "x-1", "claimed", "", 1))
    spans(WorkerEvent("w-1", "x-1", "succeeded", "", 1, None, "end"))
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["fencekeeper.node_id"] == "end" and span.attributes["fencekeeper.outcome"] == "succeeded"


@pytest.mark.parametrize(
    ("environment", "spans_made"),
    [({}, False), ({"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}, True)],
)
def test_a_worker_imports_the_tracing_api_only_where_a_provider_may_be_configured(
    environment: dict[str, str], spans_made: bool
) -> None:
    # In a fresh process nothing has imported the API, so no provider can have been set in code:
    # visit_spans answers None without importing it (start-up time of every worker command).
    # A provider named in the environment is still found, and then the API is imported.
    script = (
        "import sys\n"
        "from fencekeeper.adapters.observe import visit_spans\n"
        "spans = visit_spans()\n"
        "print(spans is not None, 'opentelemetry' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | environment
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(spans_made), str(spans_made)]


def test_a_visit_spans_made_directly_follows_the_global_provider_once_it_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    spans = VisitSpans()
    spans(WorkerEvent("w-1", "x-1", "claimed", "", 1))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    spans(WorkerEvent("w-1", "x-1", "step", "a -> end", 1, None, "a"))
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["fencekeeper.node_id"] == "a"
