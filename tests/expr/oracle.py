"""A second evaluator of condition trees, written differently, for differential tests.

The kernel's evaluator walks ``Truth`` values with explicit Kleene rules.
This one ranks truth values ``FALSE < UNKNOWN < TRUE`` and uses ``min`` for
``and``, ``max`` for ``or`` and ``2 - rank`` for ``not`` (the textbook
definition of Kleene's strong logic), and compares with Python's
:mod:`operator` functions only where both sides are of one family (two
strings, two booleans, two non-boolean numbers).  Anything else is unknown.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from fencekeeper.kernel.expr import (
    INTEGER_MAX,
    INTEGER_MIN,
    And,
    Compare,
    CompareOp,
    Expr,
    In,
    ListLiteral,
    Literal,
    Name,
    Not,
    Or,
    Truth,
)

FALSE, UNKNOWN, TRUE = 0, 1, 2
_TRUTH = {FALSE: Truth.FALSE, UNKNOWN: Truth.UNKNOWN, TRUE: Truth.TRUE}
_OPERATORS: dict[CompareOp, Callable[[Any, Any], bool]] = {
    CompareOp.EQ: operator.eq,
    CompareOp.NE: operator.ne,
    CompareOp.LT: operator.lt,
    CompareOp.LE: operator.le,
    CompareOp.GT: operator.gt,
    CompareOp.GE: operator.ge,
}

_Missing = type("_Missing", (), {})
MISSING = _Missing()


def oracle(expr: Expr, bindings: Mapping[str, object]) -> Truth:
    return _TRUTH[_rank(expr, bindings)]


def _family(value: object) -> str | None:
    if type(value) is bool:
        return "bool"
    if type(value) is str:
        return "str"
    if type(value) is int:
        assert isinstance(value, int)
        return "number" if INTEGER_MIN <= value <= INTEGER_MAX else None
    if type(value) is float:
        assert isinstance(value, float)
        return "number" if math.isfinite(value) else None
    return None


def _value(expr: Expr, bindings: Mapping[str, object]) -> object:
    if isinstance(expr, Literal):
        return expr.value
    if isinstance(expr, Name):
        value = bindings.get(expr.name, MISSING)
        return value if _family(value) is not None else MISSING
    rank = _rank(expr, bindings)
    return MISSING if rank == UNKNOWN else rank == TRUE


def _compare(op: CompareOp, left: object, right: object) -> int:
    family = _family(left)
    if family is None or family != _family(right):
        return UNKNOWN
    if family == "bool" and op not in (CompareOp.EQ, CompareOp.NE):
        return UNKNOWN
    return TRUE if _OPERATORS[op](left, right) else FALSE


def _members(collection: ListLiteral | Name, bindings: Mapping[str, object]) -> list[object] | None:
    if isinstance(collection, ListLiteral):
        return [item.value for item in collection.items]
    value = bindings.get(collection.name, MISSING)
    if not isinstance(value, list | tuple) or type(value) not in (list, tuple):
        return None
    if any(_family(element) is None for element in value):
        return None
    return list(value)


def _rank(expr: Expr, bindings: Mapping[str, object]) -> int:
    if isinstance(expr, Literal | Name):
        value = _value(expr, bindings)
        if type(value) is not bool:
            return UNKNOWN
        return TRUE if value else FALSE
    if isinstance(expr, Compare):
        left, right = _value(expr.left, bindings), _value(expr.right, bindings)
        if left is MISSING or right is MISSING:
            return UNKNOWN
        return _compare(expr.op, left, right)
    if isinstance(expr, In):
        item = _value(expr.item, bindings)
        members = _members(expr.collection, bindings)
        if item is MISSING or members is None:
            rank = UNKNOWN
        else:
            rank = max((_compare(CompareOp.EQ, item, m) for m in members), default=FALSE)
        return 2 - rank if expr.negated else rank
    if isinstance(expr, Not):
        return 2 - _rank(expr.operand, bindings)
    if isinstance(expr, And):
        return min(_rank(o, bindings) for o in expr.operands)
    assert isinstance(expr, Or)
    return max(_rank(o, bindings) for o in expr.operands)
