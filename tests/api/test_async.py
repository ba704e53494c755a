"""The asyncio client: the same answers and exceptions as the synchronous one, off the event loop's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

import fencekeeper
from fencekeeper.adapters import examples
from fencekeeper.adapters.ports import GrantTable
from fencekeeper.kernel import protocol as p

WORKFLOWS = Path(__file__).resolve().parents[2] / "adapters" / "workflows"
PURCHASE = WORKFLOWS / "purchase_approval.toml"
REFUND = WORKFLOWS / "refund_needs_reconciliation.toml"


class Recording:
    """Grants everything in ``default``, and remembers which thread asked."""

    def __init__(self) -> None:
        self.grants: GrantTable = examples.grants("default", "user:operator", "user:manager")
        self.threads: set[int] = set()

    def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> p.Authority:
        self.threads.add(threading.get_ident())
        return self.grants.check(principal_id, business_id, operation, targets)


def test_a_workflow_through_the_async_client(tmp_path: Path) -> None:
    policy = Recording()

    async def scenario() -> int:
        loop_thread = threading.get_ident()
        async with await fencekeeper.connect_async(
            str(tmp_path / "a.db"), policy=policy, handler=examples.handler()
        ) as client:
            # Many admissions at once: each runs in its own thread, the store serializes them.
            admitted = await asyncio.gather(
                *(
                    client.run(PURCHASE, {"amount": 10 * n, "order_id": f"o-{n}", "order_revision": 1}, execution_id=f"po-{n}")
                    for n in range(1, 9)
                )
            )
            assert sorted(x.execution_id for x in admitted) == [f"po-{n}" for n in range(1, 9)]
            big = await client.run(PURCHASE, {"amount": 5000, "order_id": "o-big", "order_revision": 1})
            report = await client.run_until_idle(lease=5)
            assert report.finished["succeeded"] == 8 and report.finished["waiting"] == 1
            # A refusal raises the same typed exception, or comes back as the kernel's value.
            with pytest.raises(fencekeeper.Refused) as caught:
                await client.approve(big.execution_id)
            assert caught.value.code is fencekeeper.RefusalCode.NOT_AUTHORIZED
            value = await client.decide(big.execution_id, "approved", raise_on_refusal=False)
            assert isinstance(value, p.Refusal) and value.code is fencekeeper.RefusalCode.NOT_AUTHORIZED
            with pytest.raises(fencekeeper.RequestError) as bad:
                await client.get("no such id")
            assert bad.value.field == "execution_id"
            decided = await client.approve(big.execution_id, reviewer="user:manager")
            assert decided.status is fencekeeper.DecisionStatus.ACCEPTED
            await client.run_until_idle(lease=5)
            states = {x.state for x in await client.list()}
            assert states == {fencekeeper.ExecutionState.SUCCEEDED}
            # Recovery, awaited: the refund's reply is lost, settled by asking, then resumed.
            refund = await client.run(REFUND, {"amount": 5, "payment_id": "p-1"})
            await client.run_until_idle(lease=5)
            assert (await client.review(refund.execution_id)).unresolved
            await client.settle(refund.execution_id)
            resumed = await client.resume(refund.execution_id, at_node="refunded", rationale="applied, says the provider")
            assert resumed.current_node_id == "refunded"
            assert (await client.inspect(refund.execution_id)).execution.state is fencekeeper.ExecutionState.ELIGIBLE
        return loop_thread

    loop_thread = asyncio.run(scenario())
    # Every authority question was asked off the event loop's thread.
    assert policy.threads and loop_thread not in policy.threads


def test_workers_started_from_asyncio(tmp_path: Path) -> None:
    async def scenario() -> fencekeeper.PassReport:
        client = await fencekeeper.connect_async(
            str(tmp_path / "w.db"), policy=examples.grants("default", "user:operator"), handler=examples.handler()
        )
        for n in range(4):
            await client.run(PURCHASE, {"amount": n, "order_id": f"o-{n}", "order_revision": 1})
        late = await client.run(PURCHASE, {"amount": 1, "order_id": "o-late", "order_revision": 1})
        with pytest.raises(TimeoutError):
            await client.wait(late.execution_id, timeout=0.1, poll=0.02)
        pool = client.start_workers(2, lease=5, poll=0.05)
        # Waiting sleeps on the loop: another coroutine keeps running meanwhile.
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        finished = await client.wait(late.execution_id, timeout=30)
        ticker.cancel()
        assert finished.state is fencekeeper.ExecutionState.SUCCEEDED and ticks > 0
        assert await asyncio.to_thread(pool.wait_until_idle, 30)
        await asyncio.to_thread(pool.stop)
        await client.close()
        return pool.report

    report = asyncio.run(scenario())
    assert report.finished["succeeded"] == 5 and len(report.claimed) == 5
