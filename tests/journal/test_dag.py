"""The verified workflow: what verification refuses, and the order and closure it computes."""

from __future__ import annotations

import itertools

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencekeeper.kernel.dag import (
    ApprovalRequirement,
    Artifact,
    NodeDefinition,
    NodeKind,
    WorkflowDefinition,
    descendant_closure,
    verify_workflow,
    workflow_from_json,
)
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.journal_codes import JournalError

from .examples import REVIEW


def auto(node_id: str, *predecessors: str) -> NodeDefinition:
    return NodeDefinition(node_id, NodeKind.AUTOMATED, predecessors)


def refused(definition: WorkflowDefinition) -> C:
    with pytest.raises(JournalError) as caught:
        verify_workflow(definition)
    return caught.value.reason


def test_the_review_verifies_in_topological_order() -> None:
    workflow = verify_workflow(REVIEW)
    assert workflow.order == ("search", "screen-a", "screen-b", "extraction", "synthesis", "sign-off")
    assert workflow.closure(("screen-b",)) == ("screen-b", "extraction", "synthesis", "sign-off")
    assert workflow.digest.startswith("sha256:")


def test_independence_holds_both_ways() -> None:
    workflow = verify_workflow(REVIEW)
    assert workflow.independent["screen-b"] == {"screen-a"}
    assert workflow.independent["screen-a"] == {"screen-b"}
    assert workflow.independent["search"] == frozenset()


def test_order_breaks_ties_by_writing_order_whatever_the_input_order() -> None:
    workflow = verify_workflow(WorkflowDefinition("w", (auto("c", "a"), auto("b"), auto("a"))))
    assert workflow.order == ("b", "a", "c")


@pytest.mark.parametrize(
    ("nodes", "code"),
    [
        ((auto("a"), auto("a")), C.DUPLICATE_NODE),
        ((auto("a", "ghost"),), C.UNKNOWN_PREDECESSOR),
        ((auto("a", "a"),), C.WORKFLOW_CYCLE),
        ((auto("a", "c"), auto("b", "a"), auto("c", "b")), C.WORKFLOW_CYCLE),
        ((auto("a"), auto("b", "a", "a")), C.INVALID_WORKFLOW),
        ((), C.INVALID_WORKFLOW),
        ((auto("bad id"),), C.INVALID_WORKFLOW),
        ((NodeDefinition("h", NodeKind.HUMAN, (), ("r",)),), C.INVALID_WORKFLOW),  # no conduct record
        ((NodeDefinition("h", NodeKind.HUMAN, (), (), (Artifact("c", "c"),)),), C.INVALID_WORKFLOW),  # no role
        ((NodeDefinition("p", NodeKind.APPROVAL, (), ("r",)),), C.INVALID_WORKFLOW),  # no requirement
        ((NodeDefinition("p", NodeKind.APPROVAL, (), ("r",), (), ApprovalRequirement(0)),), C.INVALID_WORKFLOW),
        ((NodeDefinition("p", NodeKind.APPROVAL, (), ("r",), (), ApprovalRequirement(1, ("q",))),), C.INVALID_WORKFLOW),
        ((NodeDefinition("a", NodeKind.AUTOMATED, (), (), (), ApprovalRequirement(1)),), C.INVALID_WORKFLOW),
        ((NodeDefinition("a", NodeKind.AUTOMATED, (), (), (Artifact("k", "i"), Artifact("k", "i"))),), C.INVALID_WORKFLOW),
        ((NodeDefinition("a", NodeKind.AUTOMATED, independent_of=("a",)),), C.INVALID_WORKFLOW),
        ((NodeDefinition("a", NodeKind.AUTOMATED, independent_of=("ghost",)),), C.INVALID_WORKFLOW),
    ],
)
def test_verification_refuses(nodes: tuple[NodeDefinition, ...], code: C) -> None:
    assert refused(WorkflowDefinition("w", nodes)) is code


def test_the_digest_changes_with_anything_and_json_round_trips() -> None:
    workflow = verify_workflow(REVIEW)
    assert verify_workflow(workflow_from_json(REVIEW.to_json())).digest == workflow.digest
    changed = attrs.evolve(REVIEW, nodes=(*REVIEW.nodes[:-1], attrs.evolve(REVIEW.nodes[-1], roles=("reviewer",))))
    assert verify_workflow(changed).digest != workflow.digest


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ({"workflow": "w", "nodes": [], "extra": 1}, C.UNKNOWN_FIELD),
        ({"workflow": "w"}, C.MISSING_FIELD),
        ({"workflow": "w", "nodes": [{"id": "a", "kind": "robotic"}]}, C.MALFORMED_RECORD),
        ({"workflow": "w", "nodes": [{"id": "a", "kind": "automated", "predecessors": "b"}]}, C.MALFORMED_RECORD),
    ],
)
def test_reading_json_is_strict(value: object, code: C) -> None:
    with pytest.raises(JournalError) as caught:
        workflow_from_json(value)
    assert caught.value.reason is code


@st.composite
def dags(draw: st.DrawFn) -> WorkflowDefinition:
    count = draw(st.integers(1, 8))
    nodes = []
    for index in range(count):
        predecessors = draw(st.sets(st.integers(0, index - 1), max_size=3)) if index else set()
        nodes.append(auto(f"n{index}", *(f"n{p}" for p in sorted(predecessors))))
    return WorkflowDefinition("w", tuple(draw(st.permutations(nodes))))


@given(dags(), st.data())
def test_closure_is_exactly_the_reachable_set_in_topological_order(definition: WorkflowDefinition, data: st.DataObject) -> None:
    workflow = verify_workflow(definition)
    position = {n: i for i, n in enumerate(workflow.order)}
    for node in definition.nodes:
        assert all(position[p] < position[node.node_id] for p in node.predecessors)
    roots = tuple(data.draw(st.sets(st.sampled_from(workflow.order), min_size=1)))
    closure = workflow.closure(roots)
    # Reachable by brute force: a node is in it iff some root reaches it.
    reach = {n: {n} for n in workflow.order}
    for _ in workflow.order:
        for before, after in itertools.product(workflow.order, repeat=2):
            if (before, after) in workflow.edges:
                reach[before] |= reach[after]
    assert set(closure) == set().union(*(reach[r] for r in roots))
    assert list(closure) == sorted(closure, key=position.__getitem__)
    assert descendant_closure(workflow.edges, roots) == frozenset(closure)
