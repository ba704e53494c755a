"""A verified workflow DAG: the immutable plan whose nodes the journal records.

The DAG node journal contract (seed 002: Purpose and authority boundary, "Workflow
owns the immutable DAG"; Attempts, people, approvals, and outputs).  Rules
of this module:

- A definition is data: nodes with an id, a kind (automated, human, hybrid,
  approval), predecessors, the roles the node admits, the output artifacts
  it declares (kind and id, never a path) and, for an approval node, its
  approval requirement.  Nothing here has a state; states belong to the
  journal.
- :func:`verify_workflow` is the only way to get a :class:`VerifiedWorkflow`.
  It refuses duplicate ids, unknown predecessors and cycles, each with its
  own code, and every other shape problem as ``invalid_workflow``, naming
  the node and the field.  A verified workflow is therefore acyclic, and its
  ``order`` is a topological order (ties broken by the order nodes were
  written), which is the order every invalidation batch is appended in.
- The digest is over the canonical form of the whole definition, with every
  default written out, so two files that mean the same plan have one digest
  and a plan that differs in anything has another.  The authority policy
  and the journal header bind this digest.
- Human, hybrid and approval nodes must admit at least one role (seed:
  "an actor and role admitted by both compiled gate/approval definitions and
  the digest-bound authority policy"); human and hybrid nodes must declare
  at least one output, their owning conduct record (seed: "Human-task
  completion must bind the owning conduct record").
- ``independent_of`` names nodes whose work must be done by other actors
  (the worked example's two independent screenings); it holds both ways.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import attrs

from .canonical import Json, digest_of
from .common import shown
from .definition import IDENTIFIER
from .journal_codes import JournalCode, JournalError


class NodeKind(enum.Enum):
    AUTOMATED = "automated"
    HUMAN = "human"
    HYBRID = "hybrid"
    APPROVAL = "approval"


@attrs.frozen
class Artifact:
    """A declared output: what kind of record, and its stable id."""

    kind: str
    artifact_id: str

    def to_json(self) -> dict[str, Json]:
        return {"id": self.artifact_id, "kind": self.kind}


@attrs.frozen
class ApprovalRequirement:
    minimum: int
    roles: tuple[str, ...] = ()
    """The roles approvals are given in; each must be among them.  Empty: any role the node admits."""
    distinct_actors: bool = True
    human_only: bool = True

    def to_json(self) -> dict[str, Json]:
        return {
            "distinct_actors": self.distinct_actors,
            "human_only": self.human_only,
            "minimum": self.minimum,
            "roles": list(self.roles),
        }


@attrs.frozen
class NodeDefinition:
    node_id: str
    kind: NodeKind
    predecessors: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    """The roles that may act on this node; empty admits any role the policy grants (automated nodes only)."""
    outputs: tuple[Artifact, ...] = ()
    approval: ApprovalRequirement | None = None
    independent_of: tuple[str, ...] = ()
    """Nodes whose workers may not work on this one, nor this one's on them (two independent screenings)."""

    def to_json(self) -> dict[str, Json]:
        return {
            "approval": None if self.approval is None else self.approval.to_json(),
            "id": self.node_id,
            "independent_of": list(self.independent_of),
            "kind": self.kind.value,
            "outputs": [a.to_json() for a in self.outputs],
            "predecessors": list(self.predecessors),
            "roles": list(self.roles),
        }


@attrs.frozen
class WorkflowDefinition:
    workflow_id: str
    nodes: tuple[NodeDefinition, ...]

    def to_json(self) -> dict[str, Json]:
        return {"nodes": [n.to_json() for n in self.nodes], "workflow": self.workflow_id}


@attrs.frozen(eq=False)
class VerifiedWorkflow:
    """A workflow that passed :func:`verify_workflow`; build it only through that function."""

    definition: WorkflowDefinition
    digest: str
    order: tuple[str, ...]
    """Every node id, in topological order."""
    nodes: Mapping[str, NodeDefinition]
    successors: Mapping[str, tuple[str, ...]]
    edges: tuple[tuple[str, str], ...]
    """(predecessor, node) pairs."""
    rank: Mapping[str, int]
    """A node's position in ``order``."""
    independent: Mapping[str, frozenset[str]]
    """Node -> the nodes it must be independent of, both ways (``independent_of`` made symmetric)."""

    @property
    def workflow_id(self) -> str:
        return self.definition.workflow_id

    def closure(self, roots: Sequence[str]) -> tuple[str, ...]:
        """``roots`` and every node downstream of them, in topological order."""
        found = descendant_closure(self.edges, tuple(roots))
        return tuple(sorted(found, key=self.rank.__getitem__))


def descendant_closure(edges: tuple[tuple[str, str], ...], roots: tuple[str, ...]) -> frozenset[str]:
    """``roots`` and every node reachable from them along ``edges``.

    Contracts (PEP 316, checked by CrossHair; see tests/contracts):

    post: frozenset(roots) <= __return__
    post: all(b in __return__ for (a, b) in edges if a in __return__)
    post: all(n in roots or any(b == n and a in __return__ for (a, b) in edges) for n in __return__)
    """
    successors: dict[str, list[str]] = {}
    for before, after in edges:
        successors.setdefault(before, []).append(after)
    found = set(roots)
    stack = list(roots)
    while stack:
        for child in successors.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return frozenset(found)


def _fail(code: JournalCode, message: str) -> JournalError:
    return JournalError(code, message)


def _identifier(value: str, where: str) -> None:
    if not IDENTIFIER.fullmatch(value):
        raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: malformed identifier {shown(value)}")


def verify_workflow(definition: WorkflowDefinition) -> VerifiedWorkflow:
    """Check ``definition`` and index it, or raise JournalError naming the node and the rule."""
    _identifier(definition.workflow_id, "workflow")
    if not definition.nodes:
        raise _fail(JournalCode.INVALID_WORKFLOW, "workflow: has no nodes")
    by_id: dict[str, NodeDefinition] = {}
    for node in definition.nodes:
        _identifier(node.node_id, "node id")
        if node.node_id in by_id:
            raise _fail(JournalCode.DUPLICATE_NODE, f"node {node.node_id!r}: defined twice")
        by_id[node.node_id] = node
    for node in definition.nodes:
        _check_node(node, by_id)
    order = _topological(definition.nodes)
    independent: dict[str, set[str]] = {n.node_id: set() for n in definition.nodes}
    for node in definition.nodes:
        for other in node.independent_of:
            independent[node.node_id].add(other)
            independent[other].add(node.node_id)
    successors: dict[str, list[str]] = {n.node_id: [] for n in definition.nodes}
    edges: list[tuple[str, str]] = []
    for node_id in order:
        for before in by_id[node_id].predecessors:
            successors[before].append(node_id)
            edges.append((before, node_id))
    return VerifiedWorkflow(
        definition=definition,
        digest=digest_of(definition.to_json()),
        order=order,
        nodes=MappingProxyType(by_id),
        successors=MappingProxyType({k: tuple(v) for k, v in successors.items()}),
        edges=tuple(edges),
        rank=MappingProxyType({node_id: n for n, node_id in enumerate(order)}),
        independent=MappingProxyType({k: frozenset(v) for k, v in independent.items()}),
    )


def _check_node(node: NodeDefinition, by_id: Mapping[str, NodeDefinition]) -> None:
    where = f"node {node.node_id!r}"
    if len(set(node.predecessors)) != len(node.predecessors):
        raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: predecessors: names a node twice")
    for before in node.predecessors:
        if before == node.node_id:
            raise _fail(JournalCode.WORKFLOW_CYCLE, f"{where}: is its own predecessor")
        if before not in by_id:
            raise _fail(JournalCode.UNKNOWN_PREDECESSOR, f"{where}: predecessors: no node {before!r}")
    for other in node.independent_of:
        if other == node.node_id or other not in by_id:
            raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: independent_of: {other!r} is not another node")
    if len(set(node.independent_of)) != len(node.independent_of):
        raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: independent_of: names a node twice")
    for role in node.roles:
        _identifier(role, f"{where}: roles")
    if len(set(node.roles)) != len(node.roles):
        raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: roles: names a role twice")
    seen: set[tuple[str, str]] = set()
    for artifact in node.outputs:
        _identifier(artifact.kind, f"{where}: outputs: kind")
        _identifier(artifact.artifact_id, f"{where}: outputs: id")
        if (artifact.kind, artifact.artifact_id) in seen:
            raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: outputs: {artifact.kind}/{artifact.artifact_id} twice")
        seen.add((artifact.kind, artifact.artifact_id))
    if node.kind is not NodeKind.AUTOMATED and not node.roles:
        raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: a {node.kind.value} node must admit at least one role")
    if node.kind in (NodeKind.HUMAN, NodeKind.HYBRID) and not node.outputs:
        raise _fail(
            JournalCode.INVALID_WORKFLOW,
            f"{where}: a {node.kind.value} node must declare its conduct record among its outputs",
        )
    if (node.kind is NodeKind.APPROVAL) != (node.approval is not None):
        raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: approval: required on approval nodes and only there")
    if node.approval is not None:
        requirement = node.approval
        if requirement.minimum < 1:
            raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: approval: minimum must be at least 1")
        for role in requirement.roles:
            if role not in node.roles:
                raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: approval: role {role!r} is not one the node admits")
        if len(set(requirement.roles)) != len(requirement.roles):
            raise _fail(JournalCode.INVALID_WORKFLOW, f"{where}: approval: roles: names a role twice")


def _topological(nodes: Sequence[NodeDefinition]) -> tuple[str, ...]:
    # Kahn's algorithm, always taking the earliest-written ready node, so the
    # order is a function of the definition alone.
    waiting = {n.node_id: len(n.predecessors) for n in nodes}
    after: dict[str, list[str]] = {n.node_id: [] for n in nodes}
    for node in nodes:
        for before in node.predecessors:
            after[before].append(node.node_id)
    written = [n.node_id for n in nodes]
    order: list[str] = []
    ready = [node_id for node_id in written if waiting[node_id] == 0]
    position = {node_id: n for n, node_id in enumerate(written)}
    while ready:
        ready.sort(key=position.__getitem__)
        node_id = ready.pop(0)
        order.append(node_id)
        for child in after[node_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) != len(written):
        stuck = sorted(set(written) - set(order), key=position.__getitem__)
        raise _fail(JournalCode.WORKFLOW_CYCLE, f"nodes {stuck} form or depend on a cycle")
    return tuple(order)


# --- reading a definition from JSON -------------------------------------------------------


def workflow_from_json(value: object, where: str = "workflow") -> WorkflowDefinition:
    """A definition from its JSON form; omitted lists default to empty and ``approval`` to null.

    Raises JournalError (``unknown_field``, ``missing_field``, ``malformed_record``) naming the field.
    """
    obj = _object(value, where, required=("workflow", "nodes"), optional=())
    nodes = _list(obj["nodes"], f"{where}.nodes")
    return WorkflowDefinition(
        workflow_id=_text(obj["workflow"], f"{where}.workflow"),
        nodes=tuple(_node(item, f"{where}.nodes[{n}]") for n, item in enumerate(nodes)),
    )


def _node(value: object, where: str) -> NodeDefinition:
    obj = _object(
        value, where, required=("id", "kind"), optional=("predecessors", "roles", "outputs", "approval", "independent_of")
    )
    kind_text = _text(obj["kind"], f"{where}.kind")
    try:
        kind = NodeKind(kind_text)
    except ValueError:
        raise _fail(
            JournalCode.MALFORMED_RECORD, f"{where}.kind: {shown(kind_text)} is not one of {[k.value for k in NodeKind]}"
        ) from None
    approval = obj.get("approval")
    return NodeDefinition(
        node_id=_text(obj["id"], f"{where}.id"),
        kind=kind,
        predecessors=_texts(obj.get("predecessors", []), f"{where}.predecessors"),
        roles=_texts(obj.get("roles", []), f"{where}.roles"),
        outputs=tuple(
            _artifact(item, f"{where}.outputs[{n}]") for n, item in enumerate(_list(obj.get("outputs", []), where))
        ),
        approval=None if approval is None else _approval(approval, f"{where}.approval"),
        independent_of=_texts(obj.get("independent_of", []), f"{where}.independent_of"),
    )


def _artifact(value: object, where: str) -> Artifact:
    obj = _object(value, where, required=("kind", "id"), optional=())
    return Artifact(kind=_text(obj["kind"], f"{where}.kind"), artifact_id=_text(obj["id"], f"{where}.id"))


def _approval(value: object, where: str) -> ApprovalRequirement:
    obj = _object(value, where, required=("minimum",), optional=("roles", "distinct_actors", "human_only"))
    minimum = obj["minimum"]
    if not isinstance(minimum, int) or isinstance(minimum, bool):
        raise _fail(JournalCode.MALFORMED_RECORD, f"{where}.minimum: must be a whole number")
    return ApprovalRequirement(
        minimum=minimum,
        roles=_texts(obj.get("roles", []), f"{where}.roles"),
        distinct_actors=_flag(obj.get("distinct_actors", True), f"{where}.distinct_actors"),
        human_only=_flag(obj.get("human_only", True), f"{where}.human_only"),
    )


# Shared by the journal's own readers (journal.py): strict field access.


def _object(value: object, where: str, *, required: Sequence[str], optional: Sequence[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _fail(JournalCode.MALFORMED_RECORD, f"{where}: must be an object")
    unknown = sorted(set(value) - set(required) - set(optional))
    if unknown:
        raise _fail(JournalCode.UNKNOWN_FIELD, f"{where}: unknown field {shown(unknown[0])}")
    for name in required:
        if name not in value:
            raise _fail(JournalCode.MISSING_FIELD, f"{where}: missing field {shown(name)}")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(JournalCode.MALFORMED_RECORD, f"{where}: must be a string")
    return value


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(JournalCode.MALFORMED_RECORD, f"{where}: must be true or false")
    return value


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise _fail(JournalCode.MALFORMED_RECORD, f"{where}: must be an array")
    return value


def _texts(value: object, where: str) -> tuple[str, ...]:
    return tuple(_text(item, f"{where}[{n}]") for n, item in enumerate(_list(value, where)))


strict_object = _object
strict_text = _text
strict_flag = _flag
strict_list = _list
strict_texts = _texts
