"""The ``interpreter`` layer: one node visit planned from the execution's view (specs/interpreter.md).

Rules of this module:

- A case is what a worker holds when it plans a visit: the execution row
  (the ``protocol`` layer's form), its pinned definition revision in the
  JSON form of definitions.md, read leniently as a stored one is (or null
  when it cannot be found), the current revision of each of the
  execution's evidence objects in creation order, the lease the visit runs
  under (worker and fence), the node's own authority answer (null: no
  check was made), the authoritative time, and, for a visit that issues a
  Command, the CommandHandler's answer.
- The expectation is the kernel's plan (``interpreter.plan_visit``, then
  ``interpreter.settle`` with the handler's answer): continue at a node, or
  leave running for a target state with its code, its step and its wait
  registration, or issue a Command; with every evidence revision the plan
  commits.  Free text (a finalization's reason, an evidence ``detail``)
  is never written; times are the suite's spelling (``wire.time_text``).
- A view no worker plans from (an execution that is not running, a time
  that is not UTC, a row or evidence item not of its form: the order of
  :func:`view_problem`) is refused ``invalid_view`` naming the field
  before the kernel is asked: the kernel plans from what a store hands it
  and checks none of this itself.
- Each rule of interpreter.md a single visit can show has a case, named
  after it; the case says what the kernel must answer, and a kernel that
  answers otherwise is a fault of the case, found when the cases are built.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from fencekeeper.kernel import attempts
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import DefinitionError, from_json, parse_definition, to_mapping
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionState

from . import wire
from .basis import T0, Case

__all__ = ["INVALID_VIEW", "evidence_json", "interpreter_cases", "plan_answer", "view_problem"]

TEXT_BODY_FIELDS = frozenset({"detail"})
"""Evidence body members that are text for people (a rejection's or a handler's detail): never compared."""
TIME_BODY_FIELDS = frozenset({"started_at"})


# --- the answer ---------------------------------------------------------------------------------


def _body(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in TEXT_BODY_FIELDS:
            continue
        out[key] = _suite_time(value) if key in TIME_BODY_FIELDS else value
    return out


def _suite_time(value: Any) -> Any:
    """A time the kernel wrote in a body (ISO 8601, ``+00:00``) in the suite's one spelling; anything else as it is.

    Not :func:`.wire.parse_time`, which reads only that spelling: this reads the kernel's own text, not a case's.
    """
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    return wire.time_text(moment) if moment.tzinfo is not None else value


def evidence_json(value: Evidence) -> dict[str, Any]:
    """An evidence revision as the layer compares it: its identity, revision, state and body without text."""
    return {"object_id": value.object_id, "kind": value.kind, "revision": value.revision, "state": value.state,
            "body": _body(value.body)}


def _plan_json(plan: i.Plan) -> dict[str, Any]:
    if isinstance(plan, i.Step):
        return {"plan": "step", "step": wire.step(plan.step), "evidence": [evidence_json(e) for e in plan.evidence]}
    if isinstance(plan, i.Finish):
        return {
            "plan": "finish",
            "target": plan.target.value,
            "error_code": plan.error_code,
            "step": wire.step(plan.step),
            "wait": wire.wait_spec(plan.wait),
            "evidence": [evidence_json(e) for e in plan.evidence],
        }
    return {"plan": "invoke", "command": plan.command.to_json(), "evidence": [evidence_json(e) for e in plan.evidence]}


def _parse_result(data: Any) -> i.CommandResult:
    """The handler's answer as the worker receives it; a status or rejection no kernel value names stays as given."""
    status: Any = data.get("status")
    rejection: Any = data.get("rejection")
    with contextlib.suppress(ValueError):
        status = i.CommandStatus(status)
    if rejection is not None:
        with contextlib.suppress(ValueError):
            rejection = i.Rejection(rejection)
    return i.CommandResult(status, rejection, data.get("detail", ""), data.get("outputs", {}))


INVALID_VIEW = "invalid_view"
"""The refusal of a view no worker plans a visit from (specs/conformance.md, ``interpreter``)."""

_EXECUTION_TEXT = ("execution_id", "business_id", "definition_id", "current_node_id")
_EXECUTION_COUNTS = (("revision", 1), ("definition_revision", 1), ("step_count", 0), ("fence", 1))
_EVIDENCE_FIELDS = (("object_id", str), ("kind", str), ("revision", int), ("state", str), ("body", dict))


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def view_problem(data: Mapping[str, Any]) -> str | None:
    """The first field of ``data`` that no visit can be planned from, in the order the layer lists them; None if none.

    A worker plans only while its execution is running under its lease
    (interpreter.md, The dispatcher pass), at the store's authoritative UTC
    time (protocol.md, Values), from rows and evidence of the form the
    store keeps: anything else is no view, and no plan is answered for it.
    """
    execution = data.get("execution")
    if not isinstance(execution, Mapping):
        return "execution"
    for name in _EXECUTION_TEXT:
        if not isinstance(execution.get(name), str) or not execution.get(name):
            return f"execution.{name}"
    for name, least in _EXECUTION_COUNTS:
        if not _count(execution.get(name), least):
            return f"execution.{name}"
    if execution.get("state") != ExecutionState.RUNNING.value:
        return "execution.state"
    stored = data.get("definition")
    if stored is not None:
        try:
            from_json(json.dumps(stored), strict=False)
        except (DefinitionError, TypeError, ValueError):
            return "definition"
    evidence = data.get("evidence")
    if not isinstance(evidence, list):
        return "evidence"
    for number, item in enumerate(evidence):
        if not isinstance(item, Mapping) or not all(
            isinstance(item.get(name), kind) and not isinstance(item.get(name), bool) for name, kind in _EVIDENCE_FIELDS
        ):
            return f"evidence[{number}]"
    now = wire.parse_time(data.get("now"))
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() != timedelta(0):
        return "now"
    lease = data.get("lease")
    if not isinstance(lease, Mapping):
        return "lease"
    if not isinstance(lease.get("worker_id"), str) or not lease.get("worker_id"):
        return "lease.worker_id"
    if not _count(lease.get("fence"), 1):
        return "lease.fence"
    authority = data.get("authority")
    if authority is not None and not (isinstance(authority, Mapping) and isinstance(authority.get("granted"), bool)):
        return "authority"
    result = data.get("result")
    if result is not None and not isinstance(result, Mapping):
        return "result"
    return None


def plan_answer(data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one ``interpreter`` case, in the layer's output form."""
    field = view_problem(data)
    if field is not None:
        return {"plan": "refused", "code": INVALID_VIEW, "field": field}
    execution = wire.parse_execution(data["execution"])
    assert execution is not None
    stored = data["definition"]
    definition = None if stored is None else from_json(json.dumps(stored), strict=False)
    evidence = [wire.parse_evidence(item) for item in data["evidence"]]
    ctx = i.context_from_evidence(execution, definition, [e for e in evidence if e is not None])
    lease = data["lease"]
    authority = data["authority"]
    plan = i.plan_visit(
        ctx,
        wire.parse_time(data["now"]),
        worker_id=lease["worker_id"],
        fence=lease["fence"],
        # The view check asks only for a boolean ``granted``: a principal left out is none, not a reader's error.
        node_authority=None if authority is None else p.Authority(authority["granted"], authority.get("principal_id")),
    )
    answer = _plan_json(plan)
    if isinstance(plan, i.Invoke):
        result = data["result"]
        answer["settled"] = None if result is None else _plan_json(i.settle(plan, _parse_result(result)))
    return answer


_NORMATIVE = {
    "step": ["plan", "step", "evidence"],
    "finish": ["plan", "target", "error_code", "step", "wait", "evidence"],
    "invoke": ["plan", "command", "evidence", "settled"],
    "refused": ["plan", "code", "field"],
}


# --- the cases ----------------------------------------------------------------------------------

_DEFINITION = """\
id = "refund"
revision = 3
start = "check"
inputs = ["amount", "order_id", "note"]

[[nodes]]
id = "check"
kind = "condition"
revision = 2
expression = "input.amount >= 100"
bindings = ["input.amount"]
true_next = "ask"
false_next = "pay"

[[nodes]]
id = "ask"
kind = "request_approval"
revision = 1
operation = "refund.approve"
targets = [{ id = { from = "input.order_id" }, revision = 4 }]
policies = [{ id = "refunds", revision = 2 }]
reviewers = ["user:manager", "role:finance"]
distinct_reviewer = true
approved_next = "pay"
rejected_next = "ask_plain"
timeout = { after_seconds = 86400, next = "refused" }

[[nodes]]
id = "ask_plain"
kind = "request_approval"
revision = 1
operation = "refund.approve"
targets = [{ id = "o-fixed", revision = 1 }]
reviewers = ["user:manager"]
approved_next = "pay"
rejected_next = "refused"

[[nodes]]
id = "pay"
kind = "local_command"
revision = 5
operation = "refund.pay"
targets = [{ id = { from = "input.order_id" }, revision = 4 }]
payload = { amount = { from = "input.amount" }, currency = "EUR" }
next = "await"
on_failure = "refused"

[[nodes]]
id = "await"
kind = "wait_for_event"
revision = 1
event_type = "payment.settled"
correlation = { order_id = { from = "input.order_id" }, ref = { from = "pay.ref" } }
timeout = { after_seconds = 3600, next = "late" }
next = "settled"

[[nodes]]
id = "await_plain"
kind = "wait_for_event"
revision = 1
event_type = "payment.settled"
correlation = { order_id = { from = "input.order_id" } }
next = "settled"

[[nodes]]
id = "settled"
kind = "condition"
revision = 1
expression = "await.status == \\"ok\\""
bindings = ["await.status"]
true_next = "done"
false_next = "await_plain"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "refused"
kind = "end"
revision = 2
outcome = "failed"
error_code = "refund_refused"

[[nodes]]
id = "late"
kind = "end"
revision = 1
outcome = "failed"
error_code = "payment_late"
"""

EXECUTION_ID = "x-7"
BUSINESS = "b-1"
PRINCIPAL = "user:runner"
NOW = T0 + timedelta(minutes=5)


def _definition() -> dict[str, Any]:
    return to_mapping(parse_definition(_DEFINITION, "refund.toml"))


def _execution(node: str, *, revision: int = 6, step_count: int = 3, execution_id: str = EXECUTION_ID,
               definition_revision: int = 3) -> p.Execution:
    return p.Execution(execution_id, BUSINESS, ExecutionState.RUNNING, revision, "refund", definition_revision,
                       node, step_count, 2)


def _input(values: Mapping[str, Any], execution_id: str = EXECUTION_ID) -> Evidence:
    return Evidence(f"{execution_id}/input", i.EXECUTION_INPUT,
                    {"principal_id": PRINCIPAL, "definition_id": "refund", "definition_revision": 3,
                     "input": dict(values)}, 1, "recorded")


def _attempt(node: str, kind: str, revision: int, state: str, outputs: Mapping[str, Any] | None = None) -> Evidence:
    """An earlier visit's attempt as its current revision stands (revision ``revision`` of the execution)."""
    first = attempts.start(_execution(node, revision=revision, step_count=revision - 1), node_id=node,
                           node_revision=1, node_kind=kind, worker_id="w-0", fence=1, inputs={},
                           now=T0 + timedelta(seconds=revision))
    body: dict[str, Any] = {"status": state}
    if outputs is not None:
        body["outputs"] = dict(outputs)
    return first.next(state, body)


_GRANTED = p.Authority(True, PRINCIPAL)
_DENIED = p.Authority(False, PRINCIPAL)
_INPUT = {"amount": 250, "order_id": "o-1", "note": "n"}


class _Cases:
    def __init__(self) -> None:
        self.cases: list[Case] = []

    def add(
        self,
        name: str,
        node: str,
        *,
        expect: str,
        inputs: Mapping[str, Any] | None = _INPUT,
        earlier: tuple[Evidence, ...] = (),
        definition: dict[str, Any] | str | None = "default",
        authority: p.Authority | None = _GRANTED,
        result: Mapping[str, Any] | None = None,
        execution: p.Execution | None = None,
        fence: int = 2,
        edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        row = execution or _execution(node)
        evidence = ([] if inputs is None else [_input(inputs, row.execution_id)]) + list(earlier)
        data = {
            "execution": wire.execution(row),
            "definition": _definition() if definition == "default" else definition,
            "evidence": [evidence_json(e) for e in evidence],
            "now": wire.time_text(NOW),
            "lease": {"worker_id": "w-1", "fence": fence},
            "authority": None if authority is None else wire.authority(authority),
            "result": None if result is None else dict(result),
        }
        if edit is not None:
            edit(data)
        expected = plan_answer(data)
        settled = expected.get("settled")
        found = f"refused/{expected['field']}" if expected["plan"] == "refused" else "/".join(
            str(part) for part in (
                expected["plan"], expected.get("target") or (expected.get("step") or {}).get("next_node_id"),
                expected.get("error_code"),
                None if not settled else settled.get("target") or settled["step"]["next_node_id"],
                None if not settled else settled.get("error_code"),
            ) if part is not None
        )
        if found != expect:
            raise AssertionError(f"visit/{name}: expected {expect}, the kernel answers {found}")
        self.cases.append(
            {"id": f"visit/{name}", "input": data, "expected": expected, "normative": _NORMATIVE[expected["plan"]]}
        )


def _result(status: str, rejection: str | None = None, detail: str = "", outputs: Any = None) -> dict[str, Any]:
    return {"status": status, "rejection": rejection, "detail": detail, "outputs": {} if outputs is None else outputs}


def _edited(node_id: str, **fields: Any) -> dict[str, Any]:
    data = _definition()
    for node in data["nodes"]:
        if node["id"] == node_id:
            for key, value in fields.items():
                # None drops the field: an unknown kind keeps none of the known kind's own.
                if value is None:
                    node.pop(key, None)
                else:
                    node[key] = value
    return data


def interpreter_cases() -> list[Case]:
    """The layer's cases, in their committed order."""
    c = _Cases()

    # --- condition: true and false are branches, unknown suspends --------------------------------
    c.add("condition/true", "check", expect="step/ask")
    c.add("condition/false_is_a_branch", "check", inputs={**_INPUT, "amount": 99}, expect="step/pay")
    c.add("condition/at_the_boundary", "check", inputs={**_INPUT, "amount": 100}, expect="step/ask")
    c.add("condition/missing_binding_is_unknown", "check", inputs={"order_id": "o-1"},
          expect="finish/suspended/condition_unknown")
    c.add("condition/null_binding_is_unknown", "check", inputs={**_INPUT, "amount": None},
          expect="finish/suspended/condition_unknown")
    c.add("condition/type_mismatch_is_unknown", "check", inputs={**_INPUT, "amount": "250"},
          expect="finish/suspended/condition_unknown")
    c.add("condition/decimal_binding", "check", inputs={**_INPUT, "amount": 100.5}, expect="step/ask")
    c.add("condition/reads_a_completed_attempt", "settled",
          earlier=(_attempt("await", "wait_for_event", 5, "completed", {"status": "ok", "event_id": "ev-1"}),),
          expect="step/done")
    c.add("condition/reads_the_latest_completed_attempt", "settled",
          earlier=(_attempt("await", "wait_for_event", 4, "completed", {"status": "ok"}),
                   _attempt("await", "wait_for_event", 5, "completed", {"status": "bounced"})),
          expect="step/await_plain")
    c.add("condition/a_failed_attempt_has_no_outputs", "settled",
          earlier=(_attempt("await", "wait_for_event", 4, "completed", {"status": "bounced"}),
                   _attempt("await", "wait_for_event", 5, "failed", {"status": "ok"})),
          expect="step/await_plain")
    c.add("condition/a_node_never_completed_is_missing", "settled",
          earlier=(_attempt("await", "wait_for_event", 5, "running"),),
          expect="finish/suspended/condition_unknown")
    # The latest completed attempt's outputs are the node's, even none: never an earlier attempt's.
    c.add("condition/the_latest_completed_attempt_without_outputs_has_none", "settled",
          earlier=(_attempt("await", "wait_for_event", 4, "completed", {"status": "ok"}),
                   _attempt("await", "wait_for_event", 5, "completed")),
          expect="finish/suspended/condition_unknown")

    # --- request_approval ---------------------------------------------------------------------------
    c.add("approval/waits_for_a_decision", "ask", expect="finish/waiting")
    c.add("approval/without_timeout", "ask_plain", expect="finish/waiting")
    c.add("approval/denied_suspends", "ask", authority=_DENIED, expect="finish/suspended/not_authorized")
    c.add("approval/no_authority_check_suspends", "ask", authority=None, expect="finish/suspended/not_authorized")
    c.add("approval/unresolved_target", "ask", inputs={"amount": 250}, expect="finish/suspended/unresolved_binding")
    c.add("approval/target_id_of_another_type", "ask", inputs={**_INPUT, "order_id": 1.5},
          expect="finish/suspended/unresolved_binding")
    c.add("approval/target_id_integer_is_its_decimal", "ask", inputs={**_INPUT, "order_id": 17}, expect="finish/waiting")
    # Targets are resolved before authority is asked about them: an unresolved target is the answer, not the denial.
    c.add("approval/unresolved_target_before_authority", "ask", inputs={"amount": 250}, authority=_DENIED,
          expect="finish/suspended/unresolved_binding")

    # --- local_command -------------------------------------------------------------------------------
    c.add("command/issued_unanswered", "pay", expect="invoke")
    c.add("command/succeeded_follows_next", "pay",
          result=_result("succeeded", outputs={"ref": "r-9", "lines": [1, 2]}), expect="invoke/await")
    for kind in ("validation", "authorization", "stale_version", "rejected", "stale_fence"):
        c.add(f"command/rejected_{kind}_follows_on_failure", "pay",
              result=_result("rejected", kind, detail="refused by the ledger"), expect="invoke/refused")
    c.add("command/unknown_goes_to_reconciliation", "pay", result=_result("unknown", detail="timed out"),
          expect="invoke/reconciliation_required/command_unknown")
    c.add("command/rejected_without_a_kind_is_unknown", "pay", result=_result("rejected"),
          expect="invoke/reconciliation_required/command_unknown")
    c.add("command/an_unknown_status_is_unknown", "pay", result=_result("maybe"),
          expect="invoke/reconciliation_required/command_unknown")
    c.add("command/a_detail_with_nul_is_unknown", "pay", result=_result("succeeded", detail="a\u0000b"),
          expect="invoke/reconciliation_required/command_unknown")
    deep: dict[str, Any] = {}
    for _ in range(32):
        deep = {"d": deep}
    c.add("command/outputs_33_levels_deep_are_unknown", "pay", result=_result("succeeded", outputs=deep),
          expect="invoke/reconciliation_required/command_unknown")
    c.add("command/outputs_32_levels_deep_are_kept", "pay", result=_result("succeeded", outputs=deep["d"]),
          expect="invoke/await")
    c.add("command/denied_follows_on_failure_issuing_nothing", "pay", authority=_DENIED, expect="step/refused")
    c.add("command/no_authority_check_follows_on_failure", "pay", authority=None, expect="step/refused")
    c.add("command/unresolved_payload", "pay", inputs={"order_id": "o-1"},
          expect="finish/suspended/unresolved_binding")
    c.add("command/unresolved_target_revision", "pay",
          definition=_edited("pay", targets=[{"id": {"from": "input.order_id"}, "revision": {"from": "input.note"}}]),
          expect="finish/suspended/unresolved_binding")
    c.add("command/unresolved_payload_before_authority", "pay", inputs={"order_id": "o-1"}, authority=_DENIED,
          expect="finish/suspended/unresolved_binding")
    c.add("command/unresolved_target_before_no_authority_check", "pay", inputs={"amount": 250}, authority=None,
          expect="finish/suspended/unresolved_binding")
    shapes: tuple[tuple[str, Any], ...] = (("array", [250]), ("object", {"amount": 250}))
    for label, value in shapes:
        c.add(f"command/payload_{label}_is_unresolved", "pay", inputs={**_INPUT, "amount": value},
              expect="finish/suspended/unresolved_binding")
    c.add("command/target_id_integer_is_its_decimal", "pay", inputs={**_INPUT, "order_id": 17},
          result=_result("succeeded"), expect="invoke/await")
    revisions: tuple[tuple[str, Any], ...] = (("zero", 0), ("decimal", 2.5), ("text", "4"))
    for label, revision in revisions:
        c.add(f"command/target_revision_{label}_is_unresolved", "pay", inputs={**_INPUT, "note": revision},
              definition=_edited("pay", targets=[{"id": {"from": "input.order_id"}, "revision": {"from": "input.note"}}]),
              expect="finish/suspended/unresolved_binding")
    c.add("command/target_revision_from_a_binding", "pay", inputs={**_INPUT, "note": 7},
          definition=_edited("pay", targets=[{"id": {"from": "input.order_id"}, "revision": {"from": "input.note"}}]),
          result=_result("succeeded"), expect="invoke/await")
    c.add("command/fence_reaches_the_command", "pay", fence=9, result=_result("succeeded"), expect="invoke/await")
    c.add("command/unsettled_earlier_attempt_issues_nothing", "pay",
          earlier=(_attempt("pay", "local_command", 5, "running"),),
          expect="finish/reconciliation_required/command_unsettled")
    c.add("command/unknown_earlier_attempt_issues_nothing", "pay",
          earlier=(_attempt("pay", "local_command", 5, "unknown"),),
          expect="finish/reconciliation_required/command_unsettled")
    # Only an earlier Command blocks: a running attempt of another kind at this node issued nothing.
    c.add("command/an_earlier_attempt_of_another_kind_does_not_block", "pay",
          earlier=(_attempt("pay", "wait_for_event", 5, "running"),), result=_result("succeeded"),
          expect="invoke/await")
    # Pinning and continuations are read before the Command's own history.
    c.add("command/dangling_continuation_before_unsettled", "pay", definition=_edited("pay", on_failure="nowhere"),
          earlier=(_attempt("pay", "local_command", 5, "running"),),
          expect="finish/suspended/dangling_continuation")
    c.add("command/settled_earlier_attempts_do_not_block", "pay",
          earlier=(_attempt("pay", "local_command", 3, "failed"), _attempt("pay", "local_command", 4, "completed")),
          result=_result("succeeded"), expect="invoke/await")

    # --- wait_for_event --------------------------------------------------------------------------------
    pay_done = _attempt("pay", "local_command", 5, "completed", {"ref": "r-9"})
    c.add("wait/registers_with_timeout", "await", earlier=(pay_done,), expect="finish/waiting")
    c.add("wait/without_timeout", "await_plain", expect="finish/waiting")
    comparable: tuple[tuple[str, Any], ...] = (("integer", -12), ("true", True), ("false", False))
    for label, value in comparable:
        c.add(f"wait/correlation_{label}_as_canonical_string", "await",
              earlier=(_attempt("pay", "local_command", 5, "completed", {"ref": value}),), expect="finish/waiting")
    incomparable: tuple[tuple[str, Any], ...] = (("decimal", 1.5), ("null", None), ("array", ["r-1"]), ("object", {"r": 1}))
    for label, value in incomparable:
        c.add(f"wait/correlation_{label}_is_unresolved", "await",
              earlier=(_attempt("pay", "local_command", 5, "completed", {"ref": value}),),
              expect="finish/suspended/unresolved_binding")
    c.add("wait/correlation_never_completed_is_unresolved", "await",
          expect="finish/suspended/unresolved_binding")

    # --- end ---------------------------------------------------------------------------------------------
    c.add("end/succeeded", "done", expect="finish/succeeded")
    c.add("end/failed_with_its_error_code", "refused", expect="finish/failed/refund_refused")

    # --- the step limit ----------------------------------------------------------------------------------
    c.add("step_limit/at_100_suspends_without_a_visit", "done", execution=_execution("done", step_count=100),
          expect="finish/suspended/step_limit")
    c.add("step_limit/past_100_suspends", "check", execution=_execution("check", step_count=101),
          expect="finish/suspended/step_limit")
    c.add("step_limit/at_99_visits", "check", execution=_execution("check", step_count=99), expect="step/ask")
    c.add("step_limit/before_the_definition", "check", execution=_execution("check", step_count=100),
          definition=None, expect="finish/suspended/step_limit")

    # --- resolution and pinning ------------------------------------------------------------------------
    c.add("pinning/definition_not_found", "check", definition=None, expect="finish/suspended/definition_not_pinned")
    c.add("pinning/another_revision", "check", execution=_execution("check", definition_revision=2),
          expect="finish/suspended/definition_not_pinned")
    c.add("pinning/another_definition", "check",
          definition={**_definition(), "id": "refund-v2"}, expect="finish/suspended/definition_not_pinned")
    c.add("pinning/current_node_missing", "nowhere", expect="finish/suspended/dangling_continuation")
    c.add("pinning/continuation_names_no_node", "ask_plain", definition=_edited("ask_plain", approved_next="nowhere"),
          expect="finish/suspended/dangling_continuation")
    c.add("pinning/unsupported_kind", "done",
          definition=_edited("done", kind="teleport", outcome=None),
          expect="finish/suspended/unsupported_node")
    # Cases 4.7.0: an unsupported node's fields are not examined, its references included, so one that
    # would read an undeclared input or a node without outputs leaves the definition readable.
    unreadable_refs = {"payload": {"x": {"from": "input.nothing"}}, "targets": [{"id": {"from": "check.x"}, "revision": 1}]}
    c.add("pinning/unsupported_kind_reads_no_binding", "done",
          definition=_edited("done", kind="teleport", outcome=None, **unreadable_refs),
          expect="finish/suspended/unsupported_node")
    c.add("pinning/unsupported_kind_elsewhere_reads_no_binding", "check",
          definition=_edited("done", kind="teleport", outcome=None, **unreadable_refs),
          expect="step/ask")

    # --- step attempts: identity ---------------------------------------------------------------------
    long_id = "x-" + "7" * 130
    c.add("attempt/long_execution_id", "done", execution=_execution("done", execution_id=long_id),
          expect="finish/succeeded")
    c.add("attempt/at_125_characters", "done", execution=_execution("done", execution_id="x-" + "7" * 121),
          expect="finish/succeeded")

    # --- a view no visit is planned from: refused, naming the field ----------------------------------
    def setting(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def apply(data: dict[str, Any]) -> None:
            *parents, last = path.split(".")
            target: Any = data
            for name in parents:
                target = target[int(name)] if isinstance(target, list) else target[name]
            if value is _DELETE:
                del target[last]
            else:
                target[last] = value
        return apply

    malformed: tuple[tuple[str, str, Any, str], ...] = (
        ("now_without_offset", "now", "2026-03-01T12:05:00.123457", "now"),
        ("now_at_another_offset", "now", "2026-03-01T13:05:00.123457+01:00", "now"),
        ("execution_missing", "execution", None, "execution"),
        ("execution_waiting", "execution.state", "waiting", "execution.state"),
        ("execution_revision_as_text", "execution.revision", "6", "execution.revision"),
        ("step_count_negative", "execution.step_count", -1, "execution.step_count"),
        ("step_count_boolean", "execution.step_count", True, "execution.step_count"),
        ("current_node_null", "execution.current_node_id", None, "execution.current_node_id"),
        ("definition_unreadable", "definition.nodes", _DELETE, "definition"),
        ("evidence_without_body", "evidence.0.body", _DELETE, "evidence[0]"),
        ("fence_zero", "lease.fence", 0, "lease.fence"),
        ("worker_empty", "lease.worker_id", "", "lease.worker_id"),
        ("authority_without_granted", "authority.granted", _DELETE, "authority"),
    )
    for name, path, value, field in malformed:
        c.add(f"view/{name}", "check", edit=setting(path, value), expect=f"refused/{field}")
    c.add("view/execution_checked_before_now", "check",
          edit=lambda data: data.update(now="2026-03-01T12:05:00", execution={**data["execution"], "state": "eligible"}),
          expect="refused/execution.state")
    return c.cases


_DELETE = object()

