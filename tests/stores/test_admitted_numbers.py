"""A number a node cannot read is refused at admission, on every store, and one stored before still loads.

What these tests prove, through ``service.run`` and a worker on SQLite and
PostgreSQL:

- a names-only input holding an integer beyond 64 bits (2^64, 10^30) is
  refused with ``invalid_input`` naming ``input.amount``, and nothing is
  written; before, it was admitted and the execution suspended at its
  condition (``condition_unknown``), since the expression language reads no
  such integer (specs/expressions.md, Values);
- a 64-bit integer at either end of the range is admitted and read;
- an execution whose input was stored with such an integer before admission
  refused it still loads, is claimed and suspends exactly as it did, keeps
  its input exactly, and an operator's corrected input resumes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.ports import WORKFLOW_RUN
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition, parse_definition
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionState

BUSINESS = "default"
PRINCIPAL = "user:operator"
DEFINITION = parse_definition(
    """\
id = "threshold"
revision = 1
start = "check"
inputs = ["amount"]

[[nodes]]
id = "check"
kind = "condition"
revision = 1
expression = "input.amount >= 100"
bindings = ["input.amount"]
true_next = "done"
false_next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "threshold.toml",
)
POLICY = examples.grants(BUSINESS, PRINCIPAL)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore]:
    opened: TransactionalStore
    if request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "store.db")
    else:
        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415 - psycopg only for this one

        opened = PostgresStore(request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"))
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    try:
        yield opened
    finally:
        opened.close()


def run(store: TransactionalStore, amount: object, execution_id: str = "x-1") -> p.Outcome:
    return service.run(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="threshold",
        input={"amount": amount}, execution_id=execution_id,
    )  # fmt: skip


def work(store: TransactionalStore) -> None:
    Worker(store, "w-1", POLICY, examples.handler(), business_id=BUSINESS).run_pass()


def state(store: TransactionalStore, execution_id: str) -> tuple[ExecutionState, str | None]:
    view = store.read(execution_id)
    assert view is not None
    return view.execution.state, view.dispatch.last_error_code


@pytest.mark.parametrize("amount", [2**64, 10**30, -(2**63) - 1])
def test_an_integer_beyond_64_bits_is_refused_and_nothing_is_written(store: TransactionalStore, amount: int) -> None:
    with pytest.raises(service.OperationError) as caught:
        run(store, amount)
    assert caught.value.code == "invalid_input"
    assert caught.value.message.startswith(f"input.amount: integer {amount} is outside the 64-bit signed range")
    assert store.execution_ids() == []


def test_both_ends_of_the_64_bit_range_are_admitted_and_read(store: TransactionalStore) -> None:
    run(store, 2**63 - 1, "x-top")
    run(store, -(2**63), "x-bottom")
    work(store)
    work(store)
    assert state(store, "x-top") == (ExecutionState.SUCCEEDED, None)
    assert state(store, "x-bottom") == (ExecutionState.SUCCEEDED, None)


def _admit_unchecked(store: TransactionalStore, data: dict[str, Any]) -> None:
    """Admit as service.run did before the range check: the same records, the input unchecked."""

    def make(definition: Definition) -> tuple[p.AdmitRequest, list[Evidence]]:
        record = Evidence(
            "x-old/input",
            i.EXECUTION_INPUT,
            {
                "principal_id": PRINCIPAL,
                "definition_id": definition.definition_id,
                "definition_revision": definition.revision,
                "input": data,
            },
            1,
            "recorded",
        )
        authority = POLICY.check(PRINCIPAL, BUSINESS, WORKFLOW_RUN, ((definition.definition_id, 1),))
        request = p.AdmitRequest("x-old", BUSINESS, definition.definition_id, definition.revision, definition.start, authority)
        return request, [record]

    outcome = store.admit_run("x-old", BUSINESS, "threshold", None, make)
    assert isinstance(outcome, p.Decision), outcome


def test_an_execution_stored_with_such_an_integer_still_loads_and_suspends_as_before(
    store: TransactionalStore,
) -> None:
    _admit_unchecked(store, {"amount": 2**64})
    work(store)
    assert state(store, "x-old") == (ExecutionState.SUSPENDED, "condition_unknown")
    view = store.read("x-old")
    assert view is not None
    [record] = [e for e in view.evidence if e.kind == i.EXECUTION_INPUT]
    assert record.body["input"] == {"amount": 2**64}, "the stored integer was not kept exactly"
    # The way out is the one it always had: an operator resumes it with a corrected input, which
    # is checked as admission checks it (so 2^63 is refused there too, and writes nothing).
    with pytest.raises(service.OperationError) as caught:
        service.resume(
            store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-old", at_node="check",
            rationale="amount corrected", input={"amount": 2**63},
        )  # fmt: skip
    assert caught.value.code == "invalid_input" and "input.amount" in caught.value.message
    service.resume(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-old", at_node="check",
        rationale="amount corrected", input={"amount": 250},
    )  # fmt: skip
    work(store)
    assert state(store, "x-old") == (ExecutionState.SUCCEEDED, None)
