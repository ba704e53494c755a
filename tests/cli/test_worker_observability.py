"""A running worker can be watched: JSON log lines on stderr, Prometheus metrics over HTTP.

The worker runs as an operator runs it (``fencekeeper worker --log-json
--metrics-port 127.0.0.1:0``, the port chosen by the system and announced in
the log); the test scrapes ``/metrics`` over loopback while it runs, checks
the counters against what the worker reports it did and against the store,
stops it with SIGTERM, and reads every log line back as JSON.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import fencekeeper
from fencekeeper.adapters import examples
from tests.cli.runner import EXAMPLES, FENCEKEEPER, assert_one_error_line, environment
from tests.cli.runner import fencekeeper as run_command

PURCHASE = EXAMPLES / "purchase_approval.toml"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode("utf-8")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def test_scrape_a_running_worker_and_read_its_json_log(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    with fencekeeper.connect(str(db), policy=examples.grants("default", "user:operator"), handler=None) as client:
        for n, amount in enumerate((10, 20, 30, 5000), start=1):
            client.run(PURCHASE, {"amount": amount, "order_id": f"o-{n}", "order_revision": 1}, execution_id=f"po-{n}")
    worker = subprocess.Popen(
        [str(FENCEKEEPER), "worker", "--db", str(db), "--log-json", "--metrics-port", "127.0.0.1:0",
         "--poll", "0.1", "--lease", "5", "--json", "--id", "obs"],
        cwd=tmp_path,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert worker.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in worker.stderr], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        url = None
        while url is None and time.monotonic() < deadline:
            seen.append(json.loads(lines.get(timeout=30)))
            if seen[-1]["event"] == "metrics_listening":
                url = seen[-1]["url"]
        assert url is not None and url.startswith("http://127.0.0.1:")
        metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        while time.monotonic() < deadline:
            metrics = scrape(url)
            if metrics.get(("fencekeeper_worker_claims_total", ()), 0) >= 4 and metrics.get(
                ("fencekeeper_executions", (("state", "eligible"),)), 1
            ) == 0:
                break
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        # Not communicate(): the reader thread owns stderr.  The summary on stdout is small.
        worker.wait(timeout=30)
        assert worker.stdout is not None
        stdout = worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()
    reader.join(5)
    assert worker.returncode == 0
    summary = json.loads(stdout)

    # The counters agree with what the worker says it did, and with the store.
    assert metrics[("fencekeeper_worker_claims_total", ())] == summary["claimed"] == 4
    # Three small orders: check, place, end (3 visits each); the large one: check, then wait (2).
    assert metrics[("fencekeeper_worker_steps_total", ())] == summary["steps"] == 11
    assert metrics[("fencekeeper_worker_finished_total", (("state", "succeeded"),))] == 3
    assert metrics[("fencekeeper_worker_finished_total", (("state", "waiting"),))] == 1
    assert summary["finished"] == {"succeeded": 3, "waiting": 1}
    assert metrics[("fencekeeper_worker_claim_seconds_count", ())] == 4
    assert not any(name == "fencekeeper_worker_refusals_total" for name, _ in metrics) and summary["refused"] == []
    assert ("fencekeeper_worker_lease_renewals_total", ()) in metrics
    assert metrics[("fencekeeper_executions", (("state", "succeeded"),))] == 3
    assert metrics[("fencekeeper_executions", (("state", "waiting"),))] == 1
    assert metrics[("fencekeeper_expired_leases", ())] == 0
    assert metrics[("fencekeeper_store_up", ())] == 1

    # Every line on stderr is one JSON object; the timeline names worker, execution and fence.
    while not lines.empty():
        seen.append(json.loads(lines.get_nowait()))
    claims = [r for r in seen if r["event"] == "claimed"]
    assert sorted(r["execution_id"] for r in claims) == ["po-1", "po-2", "po-3", "po-4"]
    assert all(r["worker_id"] == "obs-1" and r["fence"] == 1 and r["level"] == "info" for r in claims)
    # A visit that ends the execution is logged as the state it leaves for, not as a step.
    assert len([r for r in seen if r["event"] == "step"]) == 7
    assert [r["detail"] for r in seen if r["event"] == "command"] == [
        f"order.place as po-{n}/a3/command" for n in (1, 2, 3)
    ]
    assert [r["execution_id"] for r in seen if r["event"] == "waiting"] == ["po-4"]
    assert any(r["event"] == "note" and "stopping" in r["detail"] for r in seen)
    assert all({"ts", "level", "event"} <= set(r) for r in seen)


def test_a_bad_metrics_address_is_usage(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(FENCEKEEPER), "worker", "--db", str(tmp_path / "x.db"), "--metrics-port", "99999", "--until-idle"],
        cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("fencekeeper: error: --metrics-port: '99999'")
    assert not (tmp_path / "x.db").exists()


def test_a_worker_that_cannot_start_ends_its_json_log_with_an_error_object(tmp_path: Path) -> None:
    # A log collector reads every line of stderr as JSON: the line that says why the run ended parses too, with
    # the same words the text line has.  Without --log-json it stays the one text line.
    missing = tmp_path / "missing.db"
    logged = run_command("worker", "--db", missing, "--until-idle", "--log-json", cwd=tmp_path)
    text = run_command("worker", "--db", missing, "--until-idle", cwd=tmp_path)
    line = assert_one_error_line(text, 2)
    assert logged.returncode == 2 and "Traceback" not in logged.stderr
    [record] = [json.loads(entry) for entry in logged.stderr.splitlines()]
    assert (record["level"], record["event"]) == ("error", "error")
    assert "fencekeeper: error: " + record["detail"] == line and "no database at" in line
    assert logged.stdout == text.stdout == ""
