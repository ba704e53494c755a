"""Admission through ``service.run`` on PostgreSQL: round trips, client CPU and wall time per admission.

Run: ``python -m bench.admission`` (PostgreSQL from FENCEKEEPER_PG_DSN or
postgresql://postgres@127.0.0.1:5432/test; a fresh schema, dropped after).

What it compares, in one process on one connection, so that the load of
the machine weighs on every side alike, three ways to make the same
admissions:

- ``predicted``, the store as shipped: decided on predicted facts, its
  ``BEGIN``, writes, ``NOTIFY`` and ``COMMIT`` in one round trip
  (``PostgresStore.admit_run``);
- ``read``: the facts read first, with ``BEGIN``, then the writes with
  ``NOTIFY`` and ``COMMIT`` (two round trips, the path before);
- ``sent``: the facts read first, the writes sent on their own
  (``Backend.write_last`` as the base class has it: ``write``, then
  ``NOTIFY`` with ``COMMIT``; three round trips, the path before that).

Blocks of ``--block`` admissions alternate between them, the order
reversed every block; it prints each side's median per admission (CPU by
``time.process_time``, wall by ``time.perf_counter``) and the median of
the blocks' quotients.  The round trips are counted
(``fencekeeper.adapters.testing.roundtrips``) after a warm-up, and are the
same on any machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from fencekeeper.adapters import examples, postgres_store, service
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.store import Backend
from fencekeeper.adapters.testing.roundtrips import counting
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition

from .worker_path import BUSINESS, DSN, PRINCIPAL, WORKFLOWS, pg_schema

SIDES = ("predicted", "read", "sent")
"""predicted: one exchange (the store as shipped); read: the facts read first; sent: and the writes before COMMIT."""


_KEPT = postgres_store._PostgresBackend.write_last


def _side(name: str) -> None:
    """Make the store's admissions those of side ``name``."""
    chosen = Backend.write_last if name == "sent" else _KEPT
    postgres_store._PostgresBackend.write_last = chosen  # type: ignore[method-assign]
    PostgresStore.predicts_admissions = name == "predicted"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", type=int, default=100, help="admissions per timed block")
    parser.add_argument("--blocks", type=int, default=30, help="timed blocks of each side")
    args = parser.parse_args(argv)
    policy = examples.grants(BUSINESS, PRINCIPAL)
    numbers = iter(range(1_000_000_000))
    try:
        with pg_schema() as schema:
            store = PostgresStore(DSN, schema=schema, pool_size=1)
            try:
                service.register(store, parse_definition(WORKFLOWS["two-node"]), BUSINESS, PRINCIPAL, policy)

                def admit() -> None:
                    outcome = service.run(
                        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
                        input={"order_id": f"o-{next(numbers)}"},
                    )
                    assert isinstance(outcome, p.Decision), outcome

                _measure(store, admit, args.block, args.blocks)
            finally:
                store.close()
    finally:
        _side("predicted")


def _measure(store: PostgresStore, admit: Callable[[], None], block: int, blocks: int) -> None:
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    wall: dict[str, list[float]] = {side: [] for side in SIDES}
    for side in SIDES:
        _side(side)
        for _ in range(20):  # every statement prepared on the connection
            admit()
        with counting(store) as tally:
            for _ in range(10):
                admit()
        print(f"{side}: {tally.round_trips / 10:g} round trips, {tally.transactions / 10:g} transactions per admission")
    for number in range(blocks):
        for side in SIDES if number % 2 == 0 else SIDES[::-1]:
            _side(side)
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            for _ in range(block):
                admit()
            cpu[side].append((time.process_time() - cpu_start) * 1000 / block)
            wall[side].append((time.perf_counter() - wall_start) * 1000 / block)
    for side in SIDES:
        print(
            f"{side}: CPU {statistics.median(cpu[side]):.3f} ms, wall {statistics.median(wall[side]):.3f} ms "
            f"per admission (medians of {blocks} blocks of {block})"
        )
    for one, other in (("predicted", "read"), ("read", "sent")):
        for name, figures in (("CPU", cpu), ("wall", wall)):
            quotients = [a / b for a, b in zip(figures[one], figures[other], strict=True)]
            print(f"{one} / {other}, {name}: {statistics.median(quotients):.3f} (median of the blocks' quotients)")


if __name__ == "__main__":
    main()
