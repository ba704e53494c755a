"""The Python driver of the conformance protocol (specs/conformance.md): the kernel, and any store.

Rules of this module:

- It speaks the protocol exactly as another implementation would: one JSON
  request per line on stdin, one JSON response per line on stdout, nothing
  else on stdout.  Every answer echoes its request's ``seq`` (protocol 1.2),
  so the runner can tell an answer from a stray line.
- The kernel layers answer from ``fencekeeper.kernel``; the store layer
  from a store factory (``--store memory|sqlite|postgres``, or
  :func:`serve` with any factory, such as a deliberately broken variant).
- A layer it was not given the means to answer (the store layer without a
  store) is declared unsupported in ``hello``, so the runner skips it.

Run: ``python -m fencekeeper.adapters.conformance.driver [--store memory|sqlite|postgres] [--dsn DSN]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

from fencekeeper.kernel.machines import MACHINES

from . import wire
from .definition_cases import evaluate_definition
from .expression_cases import evaluate_expression
from .interpreter_cases import plan_answer
from .journal_append_cases import append_answer
from .journal_cases import replay_answer
from .operations_cases import decide_operation
from .store_driver import HOLD_POINTS, StoreHarness, hold_point

PROTOCOL_VERSION = 1
"""The protocol's major number, the one ``hello`` carries; this driver speaks 1.2 (it offers the clock hold, echoes seq)."""
KERNEL_LAYERS = ("machines", "protocol", "recovery", "expressions", "definitions", "operations", "journal", "journal-append", "interpreter")


def _input(data: Any, *names: str) -> list[Any]:
    """The required members ``names`` of a case's input, or a :class:`~.wire.WireError` naming the first missing.

    Used where the layer documents no refusal of its own for a malformed input (specs/conformance.md, Layers):
    the runner then reports the driver's error, which names the member, never a reader's KeyError.
    """
    if not isinstance(data, dict):
        raise wire.WireError(f"input: must be an object, got {type(data).__name__}")
    for name in names:
        if name not in data:
            raise wire.WireError(f"input.{name}: missing")
    return [data[name] for name in names]


def _lines(chain: Any, headers: Any) -> None:
    """A journal's ``chain`` (its header first) and the ``headers`` it may name: arrays of lines, as stored."""
    if not isinstance(chain, list) or not chain or not all(isinstance(line, str) for line in chain):
        raise wire.WireError("input.chain: must be an array of lines (strings), the header first")
    if not isinstance(headers, list) or not all(isinstance(line, str) for line in headers):
        raise wire.WireError("input.headers: must be an array of lines (strings)")


def machine_answer(data: dict[str, Any]) -> dict[str, Any]:
    name, state_name, event_name = _input(data, "machine", "state", "event")
    if not isinstance(name, str) or name not in MACHINES:
        raise wire.WireError(f"input.machine: not a machine: {name!r}")
    machine = MACHINES[name]
    try:
        state = machine.state_type(state_name)
    except (ValueError, TypeError):
        raise wire.WireError(f"input.state: not a state of {name}: {state_name!r}") from None
    try:
        event = machine.event_type(event_name)
    except (ValueError, TypeError):
        raise wire.WireError(f"input.event: not an event of {name}: {event_name!r}") from None
    found = machine.table.get((state, event))
    return {"illegal": True} if found is None else {"target": found.value}


def kernel_answer(layer: str, data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one case of a kernel layer.

    A malformed input gets the layer's own refusal where the layer documents one (an ``operations`` request's
    ``invalid_request`` naming the field, a ``protocol`` request's, an ``interpreter`` view's ``invalid_view``);
    elsewhere a :class:`~.wire.WireError` naming the member, which :func:`answer` sends as the case's error.
    """
    if layer == "machines":
        return machine_answer(data)
    if layer in ("protocol", "recovery"):
        decision, rows = _input(data, "decision", "rows")
        if not isinstance(decision, str):
            raise wire.WireError(f"input.decision: not a decision: {decision!r}")
        # A missing request or ``now`` is the kernel's to refuse, naming it, as a malformed one is.
        return dict(wire.decide(decision, rows, data.get("request", wire.MISSING), data.get("now", wire.MISSING)))
    if layer == "expressions":
        source, bindings = _input(data, "source", "bindings")
        if not isinstance(bindings, dict):
            raise wire.WireError(f"input.bindings: must be an object, got {type(bindings).__name__}")
        return evaluate_expression(source, bindings)
    if layer == "definitions":
        (definition,) = _input(data, "definition")
        return evaluate_definition(definition)
    if layer == "operations":
        _input(data)
        return decide_operation(data)
    if layer == "journal":
        _lines(*_input(data, "chain", "headers"))
        return replay_answer(data)
    if layer == "journal-append":
        chain, headers, _, _, _, _, _ = _input(data, "chain", "headers", "workflow", "policy", "command", "now", "resolves")
        _lines(chain, headers)
        return append_answer(data)
    if layer == "interpreter":
        # Every member but these is judged by the view check (invalid_view naming it); these may be null, so a
        # member left out is the case's input broken, not a null.
        _input(data, "definition", "authority", "result")
        return plan_answer(data)
    raise ValueError(layer)


def serve(
    stdin: IO[str],
    stdout: IO[str],
    *,
    factory: Callable[..., Any] | None = None,
    name: str = "fencekeeper",
    layers: tuple[str, ...] = KERNEL_LAYERS,
) -> None:
    """Answer requests until end of input.  With ``factory``, the store layer is supported too."""
    harness = StoreHarness(factory) if factory is not None else None
    supported = (*layers, "store") if harness is not None else layers
    try:
        for line in stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            response = answer(request, harness, supported, name)
            stdout.write(json.dumps(response, sort_keys=True) + "\n")
            stdout.flush()
    finally:
        if harness is not None:
            harness.close()


def answer(request: dict[str, Any], harness: StoreHarness | None, supported: tuple[str, ...], name: str) -> Any:
    """The response to one request of the protocol (specs/conformance.md, The conversation), with its ``seq``."""
    response = _respond(request, harness, supported, name)
    if "seq" in request and isinstance(response, dict):
        # Echoed as it came, whatever it is: the runner judges it, not the driver.
        response = {**response, "seq": request["seq"]}
    return response


def _respond(request: dict[str, Any], harness: StoreHarness | None, supported: tuple[str, ...], name: str) -> Any:
    op = request.get("op")
    if op == "hello":
        hello: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "implementation": name, "layers": list(supported)}
        if harness is not None:
            hello["holds"] = list(HOLD_POINTS)
        return hello
    if op == "case":
        layer = request["layer"]
        if layer not in supported or layer == "store":
            return {"unsupported": True}
        try:
            return {"output": kernel_answer(layer, request["input"])}
        except wire.WireError as exc:  # the case's input broken where the layer has no refusal for it
            return {"error": f"malformed case input: {exc}"}
        except Exception as exc:  # an answer the runner reports, never a crashed driver
            return {"error": f"{type(exc).__name__}: {exc}"}
    if op == "reset":
        if harness is None:
            return {"unsupported": True}
        harness.reset()
        return {"ok": True}
    if op == "store":
        if harness is None:
            return {"unsupported": True}
        try:
            hold_point(request.get("hold"))
        except ValueError:
            return {"unsupported": True}  # a hold point of a later protocol: the runner skips the case
        return {"output": harness.handle(request)}
    if op == "bye":
        return {"ok": True}
    return {"error": f"unknown op {op!r}"}


@contextlib.contextmanager
def named_factory(kind: str, dsn: str | None) -> Iterator[Callable[..., Any]]:
    """A store factory for ``--store``: fresh, empty stores, cleaned up afterwards."""
    if kind == "memory":
        from fencekeeper.adapters.memory import MemoryStore  # noqa: PLC0415 - only the store asked for is loaded

        yield MemoryStore
        return
    if kind == "sqlite":
        from fencekeeper.adapters.sqlite_store import SQLiteStore  # noqa: PLC0415 - only the store asked for is loaded

        with tempfile.TemporaryDirectory(prefix="fk-conformance-") as directory:
            counter = iter(range(10**9))
            yield lambda clock: SQLiteStore(Path(directory) / f"{next(counter)}.db", clock=clock)
        return
    if kind == "postgres":
        import psycopg  # noqa: PLC0415 - only the store asked for is loaded
        from psycopg import sql  # noqa: PLC0415 - only the store asked for is loaded

        from fencekeeper.adapters.postgres_store import PostgresStore, migrate  # noqa: PLC0415 - only the store asked for is loaded

        url = dsn or "postgresql://postgres@127.0.0.1:5432/test"
        # One schema for the whole run, migrated once and emptied between cases: a migration per
        # case would cost half a second each.  Emptying keeps the migration record, so each store
        # still opens a schema at exactly this code's version.
        schema = f"fk_conf_{uuid.uuid4().hex[:12]}"
        migrate(url, schema)
        with psycopg.connect(url, autocommit=True) as conn:
            tables = [row[0] for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE' AND table_name <> 'schema_migrations'", (schema,))]
        # DELETE, not TRUNCATE: on tables this small it is twenty times faster.  Replica role
        # switches off the append-only triggers and the foreign keys for this one session.
        emptying = [sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)) for table in tables]

        def make(clock: Any) -> Any:
            with psycopg.connect(url) as conn:
                conn.execute("SET LOCAL session_replication_role = replica")
                for statement in emptying:
                    conn.execute(statement)
            return PostgresStore(url, schema=schema, clock=clock, pool_size=2)

        try:
            yield make
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        return
    raise ValueError(f"unknown store {kind!r}")


def load_factory(spec: str) -> tuple[Callable[..., Any], str]:
    """``MODULE:NAME`` or ``MODULE:NAME:KEY`` -> the factory it names, and a label for the report."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"--factory: expected MODULE:NAME or MODULE:NAME:KEY, got {spec!r}")
    found: Any = getattr(importlib.import_module(parts[0]), parts[1])
    if len(parts) == 3:
        found = found[parts[2]]
    if not callable(found):
        raise SystemExit(f"--factory: {spec!r} is not callable")
    return found, spec


def main(argv: list[str] | None = None) -> int:
    # Options spelt in full only, as the fencekeeper command line takes them (adapters/cli.py).
    parser = argparse.ArgumentParser(prog="python -m fencekeeper.adapters.conformance.driver", allow_abbrev=False)
    parser.add_argument("--store", choices=("memory", "sqlite", "postgres"), help="also answer the store layer")
    parser.add_argument("--dsn", help="PostgreSQL DSN for --store postgres")
    parser.add_argument(
        "--factory",
        metavar="MODULE:NAME[:KEY]",
        help="answer the store layer with any store factory: NAME in MODULE, or NAME[KEY] when NAME is a mapping "
        "of factories (a factory takes a clock, or nothing and gets store.clock assigned)",
    )
    args = parser.parse_args(argv)
    if args.dsn is not None and any(key == "schema" for key, _ in parse_qsl(urlsplit(args.dsn).query)):
        # The run gets a fresh schema of its own, dropped at the end, so a test never meets
        # another's rows; a schema named in the DSN could only be ignored or emptied.
        parser.exit(2, f"{parser.prog}: error: --dsn: give it without ?schema=; the driver makes a fresh "
                       "schema of its own for the run and drops it afterwards\n")  # fmt: skip
    if args.factory is not None:
        factory, label = load_factory(args.factory)
        serve(sys.stdin, sys.stdout, factory=factory, name=label)
        return 0
    if args.store is None:
        serve(sys.stdin, sys.stdout)
        return 0
    with named_factory(args.store, args.dsn) as factory:
        serve(sys.stdin, sys.stdout, factory=factory, name=f"fencekeeper-{args.store}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
