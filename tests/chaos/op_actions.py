"""The actions of the operations' chaos run: ``fencekeeper op worker --actions tests.chaos.op_actions``.

Three actions, built on the shipped teaching examples
(``fencekeeper.adapters.operations.examples``):

- ``transfer`` (atomic): the example's transfer, which moves money between
  two of the application's accounts and records the transfer, and then one
  more row in ``chaos_postings``, the run's own journal, with the fence of
  the Attempt that wrote it.  That table has no key, so a transfer applied
  twice would show as two rows (and two movements of the balances).
- ``capture`` (external, needs an approval): the example's payment capture
  adapter, reconcilable and *not* idempotent, over :class:`FileLogProvider`.
- ``payout`` (external): the same adapter and provider, neither idempotent
  nor reconcilable, so an ambiguous answer ends ``external_outcome_unknown``.

The provider is a file every process of a run shares (the environment
variable ``FENCEKEEPER_CHAOS_CAPTURES`` names it), written under an
exclusive lock, one JSON line per event, as a real provider's own records
would be:

- ``call``: a capture reached the provider; it is decided at once, in the
  same locked write, as ``applied`` (the reply may still be lost on its
  way back), ``declined`` (a rate limit: nothing applied, the provider says
  so) or ``dropped`` (nothing applied, but the caller sees only a timeout);
- ``lookup``: a reconciliation, with what it found.

The provider does not deduplicate: every call it applies is applied again,
so an effect performed twice shows in the log.  Replies travel 50-300 ms
back, so a kill often lands between an effect and the commit of its answer.
Whether a call is applied, declined or dropped is drawn from the run's seed,
the effect id and how many calls of it came before.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.ports import GuardedContext
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    PrincipalResolverRegistry,
)
from fencekeeper.kernel.operations import EffectClass, RetryPolicy

CAPTURES_ENV = "FENCEKEEPER_CHAOS_CAPTURES"
SEED_ENV = "FENCEKEEPER_CHAOS_SEED"
ACCOUNTS = {f"acc-{n}": 1_000 for n in range(8)}
"""The application's accounts and their balances before the run."""
POSTINGS_SQL = (
    "CREATE TABLE IF NOT EXISTS chaos_postings (operation_id TEXT NOT NULL, fence INTEGER NOT NULL, "
    "from_account TEXT NOT NULL, to_account TEXT NOT NULL, amount BIGINT NOT NULL)"
)
LOCK_SECONDS = 5.0
REPLY_SECONDS = (0.05, 0.3)
CHANCES = (("applied", 0.55), ("declined", 0.15), ("dropped", 0.15), ("lost_reply", 0.15))
"""How a call ends at the provider; ``lost_reply`` is applied and its reply lost."""

# Short waits between Attempts, so that retries happen within the run; enough Attempts that most
# operations end by their own answer rather than by the limit.
POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=0.2),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=6,
    schedule_to_close=timedelta(minutes=10),
)


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a provider log; a line cut by SIGKILL (only ever the last) is skipped."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


class FileLogProvider(examples.FakePaymentProvider):
    """The example provider's interface (``capture``, ``lookup``) over the run's shared log file."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self._path = path

    @property
    def path(self) -> Path:
        if self._path is None:
            # Read when first used: the run's own process loads the registry without a log.
            name = os.environ.get(CAPTURES_ENV)
            if not name:
                raise RuntimeError(f"{CAPTURES_ENV} must name the run's provider log")
            self._path = Path(name)
        return self._path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Any]:
        with self.path.open("a+", encoding="utf-8") as handle:
            give_up = time.monotonic() + LOCK_SECONDS
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > give_up:
                        # The provider did not answer: nothing reached it, and the caller cannot tell.
                        raise TimeoutError("the provider did not answer (its log is locked)") from None
                    time.sleep(0.01)
            try:
                yield handle
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    @staticmethod
    def _about(handle: Any, key: str) -> list[dict[str, Any]]:
        handle.seek(0)
        found = []
        for line in handle.read().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("effect_id") == key:
                found.append(entry)
        return found

    @staticmethod
    def _write(handle: Any, kind: str, key: str, **extra: Any) -> None:
        entry = {"kind": kind, "effect_id": key, "pid": os.getpid(), "t": time.time(), **extra}
        handle.seek(0, os.SEEK_END)
        handle.write(json.dumps(entry, sort_keys=True) + "\n")
        handle.flush()

    def capture(self, key: str, amount: int) -> str:
        with self._locked() as log:
            calls = sum(1 for e in self._about(log, key) if e["kind"] == "call")
            roll = random.Random(f"{os.environ.get(SEED_ENV, '0')}-{key}-{calls}").random()
            mode = "applied"
            for name, chance in CHANCES:
                if roll < chance:
                    mode = name
                    break
                roll -= chance
            self._write(log, "call", key, amount=amount)
            self._write(log, "applied" if mode == "lost_reply" else mode, key, amount=amount)
        time.sleep(random.uniform(*REPLY_SECONDS))
        if mode == "declined":
            raise examples.CaptureDeclined("rate limited: nothing captured, try again later")
        if mode in ("dropped", "lost_reply"):
            raise TimeoutError("provider timed out")
        return f"cap-{key}"

    def lookup(self, key: str) -> int | None:
        with self._locked() as log:
            applied = [e for e in self._about(log, key) if e["kind"] == "applied"]
            self._write(log, "lookup", key, found=bool(applied))
        time.sleep(random.uniform(*REPLY_SECONDS))
        return int(applied[0]["amount"]) if applied else None


def transfer(context: GuardedContext, value: dict[str, Any]) -> dict[str, Any]:
    """The example's transfer, and a posting in the run's journal, in the Operation's own transaction."""
    result = examples.transfer(context, value)
    context.execute(
        "INSERT INTO chaos_postings (operation_id, fence, from_account, to_account, amount) VALUES (?, ?, ?, ?, ?)",
        (context.operation_id, context.fence, value["from"], value["to"], value["amount"]),
    )
    return result


PROVIDER = FileLogProvider()
TRANSFER = DurableAction(
    "transfer", 1, EffectClass.ATOMIC, transfer, normalize=examples.normalize_transfer, policy=POLICY
)
CAPTURE = DurableAction(
    "capture",
    1,
    EffectClass.EXTERNAL,
    lambda value: value,
    normalize=examples.normalize_capture,
    adapter=examples.PaymentCaptureAdapter(PROVIDER, idempotent=False, reconcilable=True),
    requires_approval=True,
    policy=POLICY,
)
PAYOUT = DurableAction(
    "payout",
    1,
    EffectClass.EXTERNAL,
    lambda value: value,
    normalize=examples.normalize_capture,
    adapter=examples.PaymentCaptureAdapter(PROVIDER, idempotent=False, reconcilable=False),
    policy=POLICY,
)
RECONCILABLE = frozenset({"capture"})
"""The external actions whose adapter can look an effect up."""


def registry() -> DurableActionRegistry:
    return DurableActionRegistry((TRANSFER, CAPTURE, PAYOUT))


def resolvers() -> PrincipalResolverRegistry:
    """The examples' directory: every ``users`` v1 subject active in every tenant."""
    return examples.resolvers()


def prepare(store: Any) -> None:
    """The application's tables and accounts, if missing (``op worker`` calls it when it starts)."""
    for statement in (*examples.ACCOUNTS_SQL, POSTINGS_SQL):
        store.application_execute(statement)
    for account, balance in ACCOUNTS.items():
        store.application_execute(
            "INSERT INTO app_accounts (account_id, balance) VALUES (?, ?) ON CONFLICT DO NOTHING", (account, balance)
        )
