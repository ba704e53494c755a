"""What an operator watches, in process: one span per node visit, and the JSON log's lines.

Spans are recorded with the OpenTelemetry SDK's in-memory exporter; the
metrics endpoint and the log of a running ``fencekeeper worker`` are proved
in tests/cli/test_worker_observability.py.
"""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fencekeeper
from fencekeeper.adapters import examples, observe
from fencekeeper.adapters.observe import JsonLog, TracingUnavailable, VisitSpans, fan_out
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.worker import PassReport, WorkerEvent
from fencekeeper.kernel import protocol as p

PURCHASE = Path(__file__).resolve().parents[2] / "adapters" / "workflows" / "purchase_approval.toml"


# VisitSpans imports the API when it is made; the one `fencekeeper worker` makes (observe.visit_spans) when
# the first visit ends.  Both must make the same spans.
MAKERS: list[Callable[[TracerProvider], VisitSpans]] = [VisitSpans, observe._VisitSpansWhenNeeded]


def recorder(make: Callable[[TracerProvider], VisitSpans] = VisitSpans) -> tuple[VisitSpans, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return make(provider), exporter


@pytest.mark.parametrize("make", MAKERS, ids=["eager", "when-needed"])
def test_one_span_per_node_visit_and_a_log_line_per_event(
    tmp_path: Path, make: Callable[[TracerProvider], VisitSpans]
) -> None:
    spans, exporter = recorder(make)
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


@pytest.mark.parametrize("make", MAKERS, ids=["eager", "when-needed"])
def test_a_refused_visit_is_an_error_span_with_its_code(
    tmp_path: Path, make: Callable[[TracerProvider], VisitSpans]
) -> None:
    spans, exporter = recorder(make)
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


def test_the_worker_commands_spans_go_to_the_global_provider_set_before_or_after_it_starts() -> None:
    """visit_spans() imports the API only when a visit ends, and takes the provider the deployment set, whenever."""
    probe = """
import sys
from fencekeeper.adapters import observe
from fencekeeper.adapters.worker import WorkerEvent

early = observe.visit_spans()
assert early is not None
loaded_before_a_visit = "opentelemetry.trace" in sys.modules
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
late = observe.visit_spans()
for spans, x in ((early, "x-1"), (late, "x-2")):
    spans(WorkerEvent("w-1", x, "claimed", "", 1))
    spans(WorkerEvent("w-1", x, "succeeded", "", 1, node_id="done"))
names = sorted(s.attributes["fencekeeper.execution_id"] for s in exporter.get_finished_spans())
print(loaded_before_a_visit, names)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False ['x-1', 'x-2']", done.stdout + done.stderr


def test_without_the_api_the_worker_makes_no_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util  # noqa: PLC0415 - the function the check asks

    def absent(name: str) -> None:
        raise ModuleNotFoundError("No module named 'opentelemetry'")

    monkeypatch.setattr(importlib.util, "find_spec", absent)
    assert observe.visit_spans() is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert observe.visit_spans() is None


def test_an_api_that_is_found_but_does_not_import_makes_no_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """As when visit_spans finds no API: the visits go on, without spans."""
    import opentelemetry  # noqa: PLC0415 - the namespace whose trace module is made unimportable here

    spans = observe.visit_spans()
    assert spans is not None
    monkeypatch.delattr(opentelemetry, "trace")
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    for what in ("claimed", "step", "succeeded"):
        spans(WorkerEvent("w-1", "x-1", what, "", 1, node_id="done"))
    with pytest.raises(TracingUnavailable):
        VisitSpans()
