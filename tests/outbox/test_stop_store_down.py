"""Stopping an exporter whose store went away is prompt, and loses nothing.

A batch sent while the server goes away cannot be marked exported.  The
exporter used to try the marking for the whole ride-out (30 s), each try
waiting up to the pool's 10 s for a connection, before a stop took effect:
Ctrl-C on ``fencekeeper export`` seemed to hang.  Once stopping, it tries for
``STOP_GRACE`` seconds, each try waiting no longer than what is left of it,
then stops; what it sent and could not mark is still claimed, and is
delivered again once the claim's lease ends (at least once, never lost).
PostgreSQL, through a proxy the test cuts: the server goes away as a
failover or a network partition takes it.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest

from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.outbox import STOP_GRACE, ExportedMessage, OutboxExporter
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.operations_suite import World, open_accounts
from tests.outbox.test_export_process import export
from tests.outbox.test_exporter import Recording, make_operations


class Proxy:
    """A TCP proxy to the PostgreSQL server; ``cut`` closes every connection and refuses new ones."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    return
                server = socket.create_connection(self._upstream)
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._listener.close()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def proxied(pg_dsn: str, pg_schema: str) -> Iterator[tuple[str, Proxy]]:
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    proxy = Proxy(str(info.get("host", "127.0.0.1")), int(info.get("port", 5432)))
    yield psycopg.conninfo.make_conninfo(pg_dsn, host="127.0.0.1", port=proxy.port), proxy
    proxy.cut()


class CuttingSink(Recording):
    """Delivers, and at the first message the server goes away and the exporter is asked to stop."""

    def __init__(self, proxy: Proxy, stop: threading.Event) -> None:
        super().__init__()
        self.proxy, self.stop = proxy, stop

    def send(self, message: ExportedMessage) -> None:
        super().send(message)
        if len(self.sent) == 1:
            self.proxy.cut()
            self.stop.set()


def test_a_stop_with_the_store_gone_is_prompt_and_what_was_sent_is_delivered_again(
    pg_dsn: str, pg_schema: str, proxied: tuple[str, Proxy]
) -> None:
    clock = ManualClock()
    direct = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=2)
    try:
        open_accounts(direct, {"acc-1": 1_000_000, "acc-2": 0})
        make_operations(World(direct, clock), 2)
        [(pending,)] = direct.application_execute("SELECT count(*) FROM outbox WHERE exported_at IS NULL", ())
        assert pending > 1

        dsn, proxy = proxied
        through = PostgresOperationStore(dsn, schema=pg_schema, clock=clock, pool_size=2)
        stop = threading.Event()
        sink = CuttingSink(proxy, stop)
        exporter = OutboxExporter(through, sink, lease=timedelta(seconds=60))
        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            exporter.run(stop=stop)
        took = time.monotonic() - started
        assert caught.value.code == "store_unavailable", "the stop was not clean, and the caller is told"
        with contextlib.suppress(Exception):
            through.close()
        assert took < STOP_GRACE + 2, f"the stop took {took:.1f} s with the store gone"
        [sent] = sink.sent

        # Nothing lost: the sent message is not marked, and still claimed; once the claim's lease ends, the
        # next exporter delivers it again, with everything else.
        [(exported,)] = direct.application_execute("SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL", ())
        assert exported == 0
        clock.advance(timedelta(seconds=61))
        again = Recording()
        OutboxExporter(direct, again).run(until_idle=True)
        assert sent.message_id in {m.message_id for m in again.sent}
        assert len(again.sent) == pending
    finally:
        direct.close()


class _Cutting(http.server.BaseHTTPRequestHandler):
    """A receiver that, at the first POST, has the server go away and ``fencekeeper export`` stopped, then answers."""

    received: ClassVar[list[str]] = []
    at_first: ClassVar[Any] = None

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append(body["message_id"])
        if len(self.received) == 1:
            type(self).at_first()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_export_stopped_with_its_store_gone_exits_within_the_grace(
    pg_dsn: str, pg_schema: str, proxied: tuple[str, Proxy]
) -> None:
    clock = ManualClock(datetime.now(UTC))
    direct = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Cutting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proc: subprocess.Popen[str] | None = None
    try:
        open_accounts(direct, {"acc-1": 1_000_000, "acc-2": 0})
        make_operations(World(direct, clock), 2)
        [(pending,)] = direct.application_execute("SELECT count(*) FROM outbox", ())
        _, proxy = proxied
        parts = urllib.parse.urlsplit(pg_dsn)
        via = parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}").geturl()
        url = f"{via}{'&' if '?' in via else '?'}schema={pg_schema}"
        signalled: list[float] = []

        def at_first() -> None:
            proxy.cut()
            assert proc is not None
            signalled.append(time.monotonic())
            proc.send_signal(signal.SIGINT)
            # The reply waits for the command's handler to have run: it runs in the main thread, which a
            # loaded machine may schedule after the export thread has read a prompt reply and begun the
            # next send.  "Once stopping, no further send begins" is what is tested, not that race.
            time.sleep(1.0)

        _Cutting.received, _Cutting.at_first = [], staticmethod(at_first)
        proc = export(url, "--sink", f"http://127.0.0.1:{server.server_address[1]}/events")
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - signalled[0]
        assert took < STOP_GRACE + 3, f"it took {took:.1f} s to stop: {err}"
        assert proc.returncode == 1, err
        assert "delivered again once" in err, err
        # Nothing lost: what it sent stays claimed, and is delivered again once the claim's lease ends.
        [(exported,)] = direct.application_execute("SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL", ())
        assert exported == 0 and len(_Cutting.received) == 1
        clock.advance(timedelta(minutes=2))
        again = Recording()
        OutboxExporter(direct, again).run(until_idle=True)
        assert len(again.sent) == pending and _Cutting.received[0] in {m.message_id for m in again.sent}
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.shutdown()
        server.server_close()
        direct.close()
