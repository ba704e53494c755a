"""``fencekeeper serve``: the HTTP boundary under uvicorn, started as a user starts it and driven over real HTTP."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import connect, service
from fencekeeper.kernel.definition import parse_definition

from . import deployment

ROOT = Path(__file__).resolve().parents[2]
PURCHASE = ROOT / "docs" / "examples" / "purchase_approval.toml"


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(base: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextlib.contextmanager
def serving(db: list[str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``fencekeeper serve`` on a free loopback port with ``db`` (``--db`` and maybe ``--schema``), once it listens."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "fencekeeper", "serve", *db, "--auth", "tests.http.deployment",
         "--actions", "tests.http.deployment", "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"serve exited with {process.returncode}: {process.stderr.read() if process.stderr else ''}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("serve did not listen within 30 s")
                time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def register_purchase(url: str, schema: str | None = None) -> None:
    with contextlib.closing(connect.open_store(url, schema=schema)) as store:
        definition = parse_definition(PURCHASE.read_text(encoding="utf-8"), PURCHASE.name)
        service.register(store, definition, "acme", deployment.ALICE.executions_principal, deployment.policy())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    db = tmp_path / "served.db"
    register_purchase(str(db))
    with serving(["--db", str(db)]) as running:
        yield running


def test_serve_answers_over_http_and_stops_on_sigterm(served: tuple[str, subprocess.Popen[str]]) -> None:
    base, process = served
    alice = {"Authorization": "Bearer alice-token"}
    capture = {"action": "capture_payment", "input": {"order": "o-1", "amount": 500}}
    assert call(base, "POST", "/operations", capture, {"Idempotency-Key": "k-1"})[0] == 401
    status, created = call(base, "POST", "/operations", capture, {**alice, "Idempotency-Key": "k-1"})
    assert status == 201, created
    status, again = call(base, "POST", "/operations", capture, {**alice, "Idempotency-Key": "k-1"})
    assert status == 200 and again["operation_id"] == created["operation_id"]
    status, conflict = call(
        base, "POST", "/operations", {**capture, "input": {"order": "o-1", "amount": 7}}, {**alice, "Idempotency-Key": "k-1"}
    )
    assert status == 409 and conflict["error"]["code"] == "idempotency_conflict"
    status, record = call(base, "GET", f"/operations/{created['operation_id']}", headers=alice)
    assert status == 200 and record["state"] == "awaiting_approval"
    bob = {"Authorization": "Bearer bob-token"}
    assert call(base, "GET", f"/operations/{created['operation_id']}", headers=bob)[0] == 404
    status, run = call(
        base, "POST", "/executions",
        {"definition": "purchase-approval", "input": {"amount": 5, "order_id": "o-1", "order_revision": 1}}, alice,
    )  # fmt: skip
    assert status == 201 and run["business_id"] == "acme", run
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=15) == 0


def test_serve_refuses_an_auth_module_whose_policy_is_no_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fencekeeper.adapters import cli  # noqa: PLC0415

    (tmp_path / "broken_auth.py").write_text(
        "from tests.http.deployment import authenticate\n\ndef policy():\n    return 'grants'\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "served.db"
    register_purchase(str(db))
    assert cli.main(["serve", "--db", str(db), "--auth", "broken_auth", "--actions", "tests.http.deployment"]) == 2
    assert "policy() returned str, not an AuthorityPolicy" in capsys.readouterr().err


def test_serve_on_an_address_it_cannot_listen_on_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """An address in use and a host that does not resolve are settings that cannot be acted on, named as such.

    Left to uvicorn, each was its own log line, after "serving ... on", and exit status 3.
    """
    db = tmp_path / "served.db"
    register_purchase(str(db))
    before = db.read_bytes()
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for where, words in ((["--port", str(port)], "--port: cannot listen on 127.0.0.1:"),
                             (["--host", "no-such-host.invalid"], "--host: cannot resolve 'no-such-host.invalid'")):  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "fencekeeper", "serve", "--db", str(db), "--auth", "tests.http.deployment",
                 "--actions", "tests.http.deployment", *where],
                check=False, cwd=ROOT, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 2, done.stderr
            assert done.stderr.count("\n") == 1 and done.stderr.startswith("fencekeeper: error: "), done.stderr
            assert words in done.stderr and done.stdout == ""
    assert db.read_bytes() == before
