"""``fencekeeper worker``: a signal stops it after the current visit, and it hands back what it holds.

A worker holds a lease only while it drives an execution.  The clean
shutdown is to finish the node visit in progress (its Command has been sent;
abandoning it would leave an unknown result), commit it, and release the
lease, so another worker continues at once instead of after expiry.  The
handler here is loaded with ``--handler`` and is slow on purpose, so that the
signal arrives in the middle of a visit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.runner import EXAMPLES, FENCEKEEPER, catches, data, environment, ok

SLOW_HANDLER = '''\
"""The example handler, slowed down: it marks when a Command starts, then takes its time."""

import pathlib
import time

from fencekeeper.adapters import examples


class Slow:
    def __init__(self):
        self.inner = examples.handler()

    def execute(self, command):
        pathlib.Path("started").write_text(command.command_id)
        time.sleep(1.0)
        return self.inner.execute(command)

    def reconcile(self, command):
        return self.inner.reconcile(command)


def make():
    return Slow()
'''


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(FENCEKEEPER), "worker", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(),
    )


@pytest.mark.parametrize("log", ["text", "json"])
def test_sigint_finishes_the_visit_then_releases_the_lease(tmp_path: Path, log: str) -> None:
    (tmp_path / "slow_handler.py").write_text(SLOW_HANDLER, encoding="utf-8")
    order = '{"amount": 50, "order_id": "o-1", "order_revision": 1}'
    ok("run", EXAMPLES / "purchase_approval.toml", "--db", "shop.db", "--input", order, "--id", "po-1", cwd=tmp_path)
    json_log = ["--log-json"] if log == "json" else []
    worker = _start(tmp_path, "--db", "shop.db", "--handler", "slow_handler:make", "--id", "w", "--json", *json_log)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "started").exists():
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the Command never started"
            time.sleep(0.02)
        worker.send_signal(signal.SIGINT)
        stdout, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, stderr
    assert "stopping after the current visit" in stderr
    summary = json.loads(stdout)
    assert summary["stopped_by"] == "SIGINT"
    assert summary["released"] == ["po-1"]
    if log == "json":
        # The JSON log says the hand-back as the event a Worker says in Python code: one key to alert on.
        records = [json.loads(line) for line in stderr.splitlines()]
        released = [r for r in records if r["event"] == "released"]
        assert [(r["worker_id"], r["execution_id"], r["fence"]) for r in released] == [("w-1", "po-1", 1)]
        assert not any("released" in str(r.get("detail", "")) for r in records if r["event"] == "note")
    assert summary["refused"] == [] and summary["errors"] == []
    # The visit in progress committed (order.place succeeded, the execution moved on to done), and the
    # lease was handed back: eligible again, nobody holding it, for the next worker to finish.
    view = data("inspect", "po-1", "--db", "shop.db", cwd=tmp_path)
    assert view["execution"]["state"] == "eligible"
    assert view["execution"]["current_node_id"] == "done"
    assert view["dispatch"]["lease_token"] is None
    assert [r["event"] for r in view["history"]][-2:] == ["record_step", "release"]
    commands = [e for e in view["evidence"] if e["object_id"] == "po-1/a3/command"]
    assert [c["state"] for c in commands] == ["issued", "succeeded"]
    finished = data("worker", "--db", "shop.db", "--until-idle", cwd=tmp_path)
    assert finished["finished"] == {"succeeded": 1}


def test_sigterm_stops_an_idle_worker(tmp_path: Path) -> None:
    ok("migrate", "--db", "idle.db", cwd=tmp_path)
    worker = _start(tmp_path, "--db", "idle.db", "--poll", "0.1", "--concurrency", "2")
    try:
        # An idle worker prints nothing until it stops, so wait for its handler
        # to be in place: a fixed sleep lost that race on a loaded machine, and
        # the default action (death by SIGTERM) is what this test rules out.
        deadline = time.monotonic() + 30
        while not catches(worker.pid, signal.SIGTERM):
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker never installed its SIGTERM handler"
            time.sleep(0.02)
        time.sleep(0.3)
        assert worker.poll() is None, worker.communicate()
        worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].split() == ["worker", "summary"]
    assert any(line.split() == ["stopped", "by", "SIGTERM"] for line in lines), stdout
    assert any(line.split() == ["claimed", "0"] for line in lines), stdout
