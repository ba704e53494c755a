"""docs/operations.md's transfer action as the page writes it, its normaliser assuming a JSON object.

``normalize_transfer`` given a list raises AttributeError, not ValueError:
what an application's normaliser may well do with input it did not expect.
"""

from __future__ import annotations

from typing import Any

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    EffectClass,
    PrincipalResolverRegistry,
    RetryPolicy,
)


def normalize_transfer(value: Any) -> dict[str, Any]:
    if not isinstance(value.get("amount"), int) or value["amount"] <= 0:
        raise ValueError("amount: must be a positive whole number of cents")
    return {"from": value["from"], "to": value["to"], "amount": value["amount"]}


def registry() -> DurableActionRegistry:
    transfer = DurableAction(
        "transfer", 1, EffectClass.ATOMIC, examples.transfer, normalize=normalize_transfer,
        policy=RetryPolicy(maximum_attempts=3),
    )  # fmt: skip
    return DurableActionRegistry((transfer,))


def resolvers() -> PrincipalResolverRegistry:
    return examples.resolvers()
