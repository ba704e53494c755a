"""The command handler and grants the teaching workflows in docs/examples run with.

Rules of this module:

- It stands in for the systems a real deployment connects (an order
  service, a payment provider), with fixed, documented behaviour, so that
  every example runs the same way from the command line, the demo and the
  tests:

  * ``order.place``, ``order.ship`` and ``order.cancel`` succeed;
  * ``order.place`` of an amount above 100,000 is rejected (validation);
  * ``payment.refund`` never answers: its result is UNKNOWN, and asking
    afterwards (``reconcile``) finds that the refund *was* applied.

- Nothing here is used unless a caller asks for it: deployments implement
  :class:`~fencekeeper.adapters.ports.CommandHandler` and
  :class:`~fencekeeper.adapters.ports.AuthorityPolicy` themselves.
"""

from __future__ import annotations

from fencekeeper.kernel.interpreter import Command, CommandResult, CommandStatus, Rejection

from .ports import SYSTEM_PRINCIPAL_GRANTS, GrantTable, ScriptedHandler, succeed, unknown

ORDER_LIMIT = 100_000


def _place(command: Command) -> CommandResult:
    amount = command.payload.get("amount")
    if isinstance(amount, (int, float)) and not isinstance(amount, bool) and amount > ORDER_LIMIT:
        return CommandResult(
            CommandStatus.REJECTED, Rejection.VALIDATION, f"amount {amount} is above the order limit {ORDER_LIMIT}"
        )
    return CommandResult(CommandStatus.SUCCEEDED, None, "order placed", {"placed": True})


def handler() -> ScriptedHandler:
    """A fresh example handler (it remembers the Commands it saw)."""
    return ScriptedHandler(
        {
            "order.place": _place,
            "order.ship": succeed(shipped=True),
            "order.cancel": succeed(cancelled=True),
            "payment.refund": unknown("the payment provider did not answer in time"),
        },
        settled={"payment.refund": succeed(refunded=True)},
    )


def grants(business_id: str, *principals: str) -> GrantTable:
    """A grant table giving ``principals`` every operation in ``business_id``, plus the timer's dispatch grant."""
    table = GrantTable()
    for principal in principals:
        table.grant(principal, business_id)
    for principal, operation in SYSTEM_PRINCIPAL_GRANTS:
        table.grant(principal, business_id, operation)
    return table
