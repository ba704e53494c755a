"""Teaching examples: an atomic account transfer, an external payment capture with reconciliation, a directory.

``registry()`` and ``resolvers()`` are what ``fencekeeper op`` uses unless
``--actions`` names another factory.  The account tables are the
application's own: ``create_accounts`` makes them in a SQL store, and the
memory store keeps them in ``context.tables``.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs

from fencekeeper.kernel.common import identifier_problem
from fencekeeper.kernel.operations import EffectClass, RetryPolicy

from .ports import GuardedContext
from .service import (
    ActionFailed,
    DurableAction,
    DurableActionRegistry,
    EffectResult,
    EffectStatus,
    PrincipalReference,
    PrincipalResolution,
    PrincipalResolverRegistry,
    ResolutionStatus,
)

ACCOUNTS_SQL = (
    "CREATE TABLE IF NOT EXISTS app_accounts (account_id TEXT PRIMARY KEY, balance BIGINT NOT NULL CHECK (balance >= 0))",
    "CREATE TABLE IF NOT EXISTS app_transfers (operation_id TEXT PRIMARY KEY, from_account TEXT NOT NULL, "
    "to_account TEXT NOT NULL, amount BIGINT NOT NULL)",
)


# --- the atomic transfer --------------------------------------------------------------------------


def normalize_transfer(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != {"from", "to", "amount"}:
        raise ValueError('a transfer is {"from": ACCOUNT, "to": ACCOUNT, "amount": CENTS}')
    for key in ("from", "to"):
        problem = identifier_problem(value[key])
        if problem is not None:
            raise ValueError(f"{key}: {problem}")
    amount = value["amount"]
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ValueError(f"amount: must be a positive whole number of cents, got {amount!r}")
    if value["from"] == value["to"]:
        raise ValueError("from and to are the same account")
    return {"from": value["from"], "to": value["to"], "amount": amount}


def transfer(context: GuardedContext, value: dict[str, Any]) -> dict[str, Any]:
    """Move ``amount`` between two accounts, in the Operation's own transaction."""
    source, target, amount = value["from"], value["to"], value["amount"]
    if context.dialect == "memory":
        accounts = context.tables.setdefault("app_accounts", {})
        transfers = context.tables.setdefault("app_transfers", {})
        balance = accounts.get(source)
        if balance is None or target not in accounts:
            raise ActionFailed("unknown_account", f"{source if balance is None else target} does not exist")
        if balance < amount:
            raise ActionFailed("insufficient_funds", f"{source} holds {balance}, the transfer needs {amount}")
        accounts[source] = balance - amount
        accounts[target] += amount
        transfers[context.operation_id] = (source, target, amount)
        return {"from_balance": accounts[source], "to_balance": accounts[target]}
    rows = context.execute(
        "SELECT account_id, balance FROM app_accounts WHERE account_id IN (?, ?) ORDER BY account_id FOR UPDATE"
        if context.dialect == "postgresql"
        else "SELECT account_id, balance FROM app_accounts WHERE account_id IN (?, ?) ORDER BY account_id",
        (source, target),
    )
    balances = {str(r[0]): int(r[1]) for r in rows}
    for account in (source, target):
        if account not in balances:
            raise ActionFailed("unknown_account", f"{account} does not exist")
    if balances[source] < amount:
        raise ActionFailed("insufficient_funds", f"{source} holds {balances[source]}, the transfer needs {amount}")
    context.execute("UPDATE app_accounts SET balance = balance - ? WHERE account_id = ?", (amount, source))
    context.execute("UPDATE app_accounts SET balance = balance + ? WHERE account_id = ?", (amount, target))
    context.execute(
        "INSERT INTO app_transfers (operation_id, from_account, to_account, amount) VALUES (?, ?, ?, ?)",
        (context.operation_id, source, target, amount),
    )
    return {"from_balance": balances[source] - amount, "to_balance": balances[target] + amount}


def balance(value: dict[str, Any]) -> dict[str, Any]:
    """A read-only action: echoes what it was asked (its result is its only write)."""
    return {"account": value["account"], "checked": True}


def normalize_balance(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != {"account"}:
        raise ValueError('a balance check is {"account": ACCOUNT}')
    problem = identifier_problem(value["account"])
    if problem is not None:
        raise ValueError(f"account: {problem}")
    return {"account": value["account"]}


# --- the external payment capture ------------------------------------------------------------------


class FakePaymentProvider:
    """A payment provider with an idempotency key and a lookup, and scripted failures.

    ``mode`` scripts the next ``capture``: ``ok``; ``lost_reply`` applies the
    capture and then loses the reply (the caller sees a timeout);
    ``timeout`` times out before applying it; ``declined`` refuses it
    without applying it and says so (a rate limit: a conclusive answer, and
    worth trying again later).
    """

    def __init__(self) -> None:
        self.captures: dict[str, int] = {}
        self.calls: list[str] = []
        self.mode = "ok"
        self._lock = threading.Lock()

    def capture(self, key: str, amount: int) -> str:
        with self._lock:
            self.calls.append(key)
            if self.mode == "timeout":
                raise TimeoutError("provider timed out")
            if self.mode == "declined":
                raise CaptureDeclined("rate limited: nothing captured, try again later")
            self.captures.setdefault(key, amount)
            if self.mode == "lost_reply":
                raise TimeoutError("reply lost")
            return f"cap-{key}"

    def lookup(self, key: str) -> int | None:
        with self._lock:
            return self.captures.get(key)


class CaptureDeclined(Exception):
    """The provider's own answer that it did not capture (a refusal, not a lost reply)."""


@attrs.define
class PaymentCaptureAdapter:
    """The ExternalEffectAdapter of a provider: the effect id is the provider's idempotency key."""

    provider: FakePaymentProvider
    idempotent: bool = True
    reconcilable: bool = True

    def perform(self, effect_id: str, payload: Any) -> EffectResult:
        try:
            receipt = self.provider.capture(effect_id, int(payload["amount"]))
        except TimeoutError as exc:
            return EffectResult(EffectStatus.AMBIGUOUS, detail=str(exc))
        except CaptureDeclined as exc:
            return EffectResult(EffectStatus.FAILED, detail=str(exc), retryable=True)
        return EffectResult(EffectStatus.SUCCEEDED, {"receipt": receipt, "amount": payload["amount"]})

    def reconcile(self, effect_id: str) -> EffectResult | None:
        if not self.reconcilable:
            return None
        amount = self.provider.lookup(effect_id)
        if amount is None:
            return EffectResult(EffectStatus.NOT_FOUND, detail="the provider has no capture under this key")
        return EffectResult(EffectStatus.SUCCEEDED, {"receipt": f"cap-{effect_id}", "amount": amount})


def normalize_capture(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != {"order", "amount"}:
        raise ValueError('a capture is {"order": ORDER, "amount": CENTS}')
    problem = identifier_problem(value["order"])
    if problem is not None:
        raise ValueError(f"order: {problem}")
    amount = value["amount"]
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ValueError(f"amount: must be a positive whole number of cents, got {amount!r}")
    return {"order": value["order"], "amount": amount}


# --- the directory ----------------------------------------------------------------------------------


class Directory:
    """A principal resolver over an explicit, mutable table of subjects (revocation takes effect at once)."""

    def __init__(self, subjects: dict[str, tuple[ResolutionStatus, frozenset[str]]] | None = None) -> None:
        self.subjects = dict(subjects or {})
        self.default: tuple[ResolutionStatus, frozenset[str]] | None = None
        self._lock = threading.Lock()

    def set(self, subject: str, status: ResolutionStatus, tenants: frozenset[str] = frozenset()) -> None:
        with self._lock:
            self.subjects[subject] = (status, tenants)

    def resolve(self, reference: PrincipalReference) -> PrincipalResolution:
        with self._lock:
            entry = self.subjects.get(reference.subject, self.default)
        if entry is None:
            return PrincipalResolution(ResolutionStatus.MISSING, reference, reason=f"{reference.subject} is unknown")
        status, tenants = entry
        return PrincipalResolution(status, reference, tenants if status is ResolutionStatus.ACTIVE else frozenset())


PROVIDER = FakePaymentProvider()
"""The provider ``fencekeeper op`` captures with (in-process: a teaching stand-in for a real gateway)."""

TRANSFER = DurableAction(
    "transfer",
    1,
    EffectClass.ATOMIC,
    transfer,
    normalize=normalize_transfer,
    policy=RetryPolicy(maximum_attempts=3),
)
CAPTURE = DurableAction(
    "capture_payment",
    1,
    EffectClass.EXTERNAL,
    lambda value: value,
    normalize=normalize_capture,
    adapter=PaymentCaptureAdapter(PROVIDER),
    requires_approval=True,
)
BALANCE = DurableAction("balance", 1, EffectClass.READ_ONLY, balance, normalize=normalize_balance)


def registry() -> DurableActionRegistry:
    return DurableActionRegistry((TRANSFER, CAPTURE, BALANCE))


def resolvers() -> PrincipalResolverRegistry:
    """The command line's directory: ``users`` v1, every subject active in every tenant (the local operator's tool)."""
    directory = Directory()
    directory.default = (ResolutionStatus.ACTIVE, frozenset({"*"}))
    registry = PrincipalResolverRegistry()
    registry.register("users", 1, directory)
    return registry


def prepare(store: Any) -> None:
    """Create the example's application tables and two demo accounts, if missing (what ``op worker`` calls)."""
    run = getattr(store, "application_execute", None)
    if run is None:
        return
    for statement in ACCOUNTS_SQL:
        run(statement)
    for account, amount in (("acc-1", 10_000), ("acc-2", 0)):
        run("INSERT INTO app_accounts (account_id, balance) VALUES (?, ?) ON CONFLICT DO NOTHING", (account, amount))
