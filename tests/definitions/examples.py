"""The example definition of specs/definitions.md, and its digest; and the smallest workflow that waits for an Event."""

from __future__ import annotations

EXAMPLE = """\
id = "purchase-approval"
revision = 1
title = "Purchase approval"
start = "check_amount"
inputs = ["amount", "order_id", "order_revision"]

[[nodes]]
id = "check_amount"
kind = "condition"
revision = 1
expression = "input.amount >= 1000"
bindings = ["input.amount"]
true_next = "ask_manager"
false_next = "place_order"

[[nodes]]
id = "ask_manager"
kind = "request_approval"
revision = 1
operation = "purchase.approve"
targets = [{ id = { from = "input.order_id" }, revision = { from = "input.order_revision" } }]
policies = [{ id = "purchasing", revision = 3 }]
reviewers = ["user:manager"]
distinct_reviewer = true
approved_next = "place_order"
rejected_next = "rejected"
timeout = { after_seconds = 86400, next = "rejected" }

[[nodes]]
id = "await_payment"
kind = "wait_for_event"
revision = 1
event_type = "payment.received"
correlation = { order_id = { from = "input.order_id" } }
next = "done"
timeout = { after_seconds = 3600, next = "rejected" }

[[nodes]]
id = "place_order"
kind = "local_command"
revision = 1
operation = "order.place"
targets = [{ id = { from = "input.order_id" }, revision = { from = "input.order_revision" } }]
payload = { amount = { from = "input.amount" }, channel = "web" }
next = "await_payment"
on_failure = "rejected"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "rejected"
kind = "end"
revision = 1
outcome = "failed"
error_code = "order_rejected"
"""

EXAMPLE_DIGEST = "sha256:0f908c37e3f55799b2f63cae3303f8bb40012e1d806b559cb3703332dbda54cc"
"""Published in specs/definitions.md: the canonical form may never change silently."""

WAITS = """\
id = "waits"
revision = 1
start = "await_payment"
inputs = ["order_id"]

[[nodes]]
id = "await_payment"
kind = "wait_for_event"
revision = 1
event_type = "payment.received"
correlation = { order_id = { from = "input.order_id" } }
next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
"""
"""One wait for ``payment.received`` correlated on ``order_id``, then the end: what the stored-text and payload tests publish to."""
