"""An actions module allowing each operation one Attempt, for ``op worker`` whose connections are ended.

Each action takes a moment (``PAUSE``), the transfer inside its transaction.
One Attempt, so that an owner write whose answer was lost and left to expire
would end the operation ``max_attempts_exceeded`` (or, for the capture,
``external_outcome_unknown``) rather than be retried: the outage test sees
every such loss.  The transfer writes the example's application tables
(``prepare`` creates them); the capture's provider lives in the worker's
process and deduplicates by the effect id.
"""

from __future__ import annotations

import time
from typing import Any

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.examples import prepare
from fencekeeper.adapters.operations.ports import GuardedContext
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    EffectResult,
    PrincipalResolverRegistry,
)
from fencekeeper.kernel.operations import EffectClass, RetryPolicy

ONCE = RetryPolicy(maximum_attempts=1)
PROVIDER = examples.FakePaymentProvider()
PAUSE = 0.03
"""Seconds each action takes: long enough that a backend ended now and then is ended while one runs."""


def transfer(context: GuardedContext, value: dict[str, Any]) -> dict[str, Any]:
    result = examples.transfer(context, value)
    time.sleep(PAUSE)  # inside the transaction: its connection can be ended before the commit
    return result


def balance(value: dict[str, Any]) -> dict[str, Any]:
    time.sleep(PAUSE)
    return examples.balance(value)


class SlowCapture(examples.PaymentCaptureAdapter):
    def perform(self, effect_id: str, payload: Any) -> EffectResult:
        time.sleep(PAUSE)
        return super().perform(effect_id, payload)


def registry() -> DurableActionRegistry:
    return DurableActionRegistry(
        (
            DurableAction(
                "transfer", 1, EffectClass.ATOMIC, transfer, normalize=examples.normalize_transfer,
                policy=ONCE,
            ),
            DurableAction(
                "balance", 1, EffectClass.READ_ONLY, balance, normalize=examples.normalize_balance,
                policy=ONCE,
            ),
            DurableAction(
                "capture", 1, EffectClass.EXTERNAL, lambda value: value, normalize=examples.normalize_capture,
                adapter=SlowCapture(PROVIDER), policy=ONCE,
            ),
        )
    )  # fmt: skip


def resolvers() -> PrincipalResolverRegistry:
    return examples.resolvers()


__all__ = ["prepare", "registry", "resolvers"]
