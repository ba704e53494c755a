"""The ``expressions`` layer (specs/expressions.md), generated from the kernel.

Rules of this module:

- Bindings are tagged (:func:`tagged`), so that an integer stays an
  integer and 2**63 reaches the implementation exactly.
- The sources cover every operator, the Kleene tables, each class of
  refusal and each limit on both sides; the expectation is the kernel's
  parse and evaluation.  Only the result and the code are normative.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fencekeeper.kernel import expr as x

from .basis import Case

# --- expressions ---------------------------------------------------------------------------

BIG = 2**63


def tagged(value: object) -> Any:
    """A binding in the tagged form of specs/conformance.md (numbers keep integer or decimal)."""
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "integer", "value": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"type": "decimal", "value": "nan"}
        if value in (float("inf"), float("-inf")):
            return {"type": "decimal", "value": "inf" if value > 0 else "-inf"}
        return {"type": "decimal", "value": repr(value)}
    if isinstance(value, str):
        return {"type": "string", "value": value}
    if value is None:
        return {"type": "null"}
    if isinstance(value, list | tuple):
        return {"type": "array", "value": [tagged(v) for v in value]}
    if isinstance(value, dict):
        return {"type": "map", "value": {str(k): tagged(v) for k, v in value.items()}}
    raise TypeError(value)


def untagged(data: Any) -> object:
    kind = data["type"]
    if kind == "bool":
        return bool(data["value"])
    if kind == "integer":
        return int(data["value"])
    if kind == "decimal":
        return float(data["value"])
    if kind == "string":
        return str(data["value"])
    if kind == "null":
        return None
    if kind == "array":
        return [untagged(v) for v in data["value"]]
    if kind == "map":
        return {k: untagged(v) for k, v in data["value"].items()}
    raise ValueError(f"unknown binding type {kind!r}")


def evaluate_expression(source: str, bindings: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one expression case."""
    try:
        tree = x.parse(source)
    except x.ExpressionError as exc:
        return {"result": "error", "code": exc.code, "position": exc.position}
    return {"result": x.evaluate(tree, {k: untagged(v) for k, v in bindings.items()}).value}


_EVALUATIONS: list[tuple[str, dict[str, object]]] = [
    ("a == 1", {"a": 1}), ("a == 1", {"a": 2}), ("a == 1", {"a": 1.0}), ("a == 1.5", {"a": 1.5}),
    ("a != 1", {"a": 2}), ("a != 1", {"a": 1}), ("a < 2", {"a": 1}), ("a < 2", {"a": 2}),
    ("a <= 2", {"a": 2}), ("a <= 2", {"a": 2.5}), ("a > 2", {"a": 3}), ("a > 2", {"a": 2}),
    ("a >= 2", {"a": 2.0}), ("a >= 2", {"a": 1.999}), ("a > -1", {"a": 0}), ("a == -0.0", {"a": 0}),
    ("a < 1.0e16", {"a": 10**15}), ("a == 9007199254740993", {"a": 9007199254740992.0}),
    ("a == 9223372036854775807", {"a": 2**63 - 1}), ("a == -9223372036854775808", {"a": -(2**63)}),
    ("a == b", {"a": 3, "b": 3}), ("1 < 2", {}), ("a == 'x'", {"a": "x"}), ('a == "x"', {"a": "y"}),
    ("a != 'x'", {"a": "y"}), ("a < 'b'", {"a": "a"}), ("a < 'a'", {"a": "Z"}), ("a >= 'ab'", {"a": "b"}),
    ("a <= ''", {"a": "x"}), ("a == 'it\\'s'", {"a": "it's"}), ('a == "\\\\"', {"a": "\\"}),
    ("a < 'é'", {"a": "z"}), ("a < '\U0001f600'", {"a": "\uffff"}),
    ("a == true", {"a": True}), ("a == false", {"a": True}), ("a != true", {"a": False}),
    ("a < true", {"a": False}), ("a >= false", {"a": True}), ("true", {}), ("false", {}),
    ("a", {"a": True}), ("a", {"a": False}), ("(a > 1) == true", {"a": 2}), ("(a > 1) == b", {"a": 0, "b": False}),
    ("(a > 1) == true", {}), ("(a and b) != (a or b)", {"a": True, "b": False}),
    ("a == 1", {"a": "1"}), ("a == 'x'", {"a": 1}), ("a == 1", {"a": True}), ("a == true", {"a": 1}),
    ("a < 1", {"a": "0"}), ("a == b", {"a": 1, "b": "1"}), ("a != 1", {"a": "x"}),
    ("a == 1", {}), ("a != 1", {}), ("a == 1", {"a": None}), ("a != 1", {"a": None}),
    ("a == 1", {"a": float("nan")}), ("a > 1", {"a": float("inf")}), ("a == 1", {"a": BIG}),
    ("a == 1", {"a": -BIG - 1}), ("a == 1", {"a": [1]}), ("a == 1", {"a": {"b": 1}}),
    ("a.b == 1", {"a": {"b": 1}}), ("a.b == 1", {"a.b": 1}), ("1", {}), ("'yes'", {}), ("a", {"a": 1}),
    ("a", {"a": "true"}), ("a", {}), ("not a", {"a": 0}), ("a and true", {"a": "x"}), ("a or false", {"a": None}),
    ("a in [1, 2]", {"a": 2}), ("a in [1, 2]", {"a": 3}), ("a in [1, 2.5]", {"a": 2.5}), ("a in [1, 2]", {"a": 1.0}),
    ("a in ['x', 'y']", {"a": "y"}), ("a in ['x', 'y']", {"a": "z"}), ("a in [true]", {"a": True}),
    ("a in [true]", {"a": False}), ("a in []", {"a": 1}), ("a in []", {}), ("a in [1, 2]", {"a": "1"}),
    ("a in [1, 2]", {"a": True}), ("a in [1, 2]", {}), ("a not in [1, 2]", {"a": 3}),
    ("a not in [1, 2]", {"a": 1}), ("a not in [1, 2]", {"a": "1"}), ("a not in [1, 2]", {}),
    ("a in b", {"a": 1, "b": [0, 1]}), ("a in b", {"a": 2, "b": [0, 1]}), ("a in b", {"a": 2, "b": []}),
    ("a in b", {"a": 1, "b": [1, "x"]}), ("a in b", {"a": 2, "b": [1, "x"]}), ("a in b", {"a": 1, "b": [1, None]}),
    ("a in b", {"a": 1, "b": [1, [1]]}), ("a in b", {"a": 1, "b": [1, float("nan")]}),
    ("a in b", {"a": "a", "b": "abc"}), ("a in b", {"a": 1, "b": {"1": 1}}), ("a in b", {"a": 1, "b": 1}),
    ("a in b", {"a": 1}), ("a not in b", {"a": 2, "b": [0, 1]}), ("a not in b", {"a": 1, "b": [0, 1]}),
    ("a not in b", {"a": 1}), ("not a == 1", {"a": 1}), ("not a in [1]", {"a": 2}),
    ("a or b and c", {"a": True, "b": False, "c": False}), ("(a or b) and c", {"a": True, "b": False, "c": False}),
    ("not a or b", {"a": True, "b": True}), ("not (a or b)", {"a": False, "b": True}),
    ("input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
     {"input.amount": 250, "input.currency": "EUR", "await_payment.refunded": False}),
    ("input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
     {"input.amount": 250, "input.currency": "EUR"}),
    ("input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
     {"input.amount": 50, "input.currency": "EUR"}),
    ("a == 0.1", {"a": 0.1}), ("a == 1e-5", {}), ("a == 1.5e-5", {"a": 1.5e-5}), ("a < 1.0e308", {"a": 5}),
]

_REFUSED_SOURCES = [
    "", "   ", "x" * 1001, "a ==", "a == b c", "a < b < c", "x == 'abc", "'a\\nb'", "a = 1", "a && b", "True",
    "in == 1", "x.not == 1", "__import__('os')", "a[0]", "a == 1 + 1", "007 == a", "a in [1, 'x']",
    "(" * 17 + "a" + ")" * 17, "not " * 17 + "a", "a in [" + ", ".join(["1"] * 65) + "]",
    " or ".join(["a"] * 101), "1e5 == a", "1. == a", "1.5.2 == a", "2x == a", "- 1 == a", "-a == 1",
    "Amount == 1", "a == 1.0e999", "a == 9223372036854775808", "a == -9223372036854775809",
    "a == '" + "x" * 257 + "'", "a == 'x\u0001'", "a in [1,]", "a in [b]", "a == [1]", "not", "a and",
    "(a", "a)", "a == b == c", "a in b in c", "a not b", "'unterminated\n'", "a == \"\\x\"", "a == 1 !",
    "a.b. == 1", "a..b == 1", "_ == 1", "a == tru", "a ==", "[1] == a",
]

_BOUNDARY_SOURCES = [
    "(" * 16 + "a" + ")" * 16, "not " * 16 + "a", "a in [" + ", ".join(["1"] * 64) + "]",
    " or ".join(["a"] * 100), "a == '" + "x" * 256 + "'", "a == 9223372036854775807",
    "a == -9223372036854775808", "x" * 1000,
]

_KLEENE = {"T": True, "F": False, "U": None}


def expression_cases() -> list[Case]:
    cases: list[Case] = []
    seen: set[str] = set()

    def add(group: str, source: str, bindings: dict[str, object]) -> None:
        tags = {k: tagged(v) for k, v in bindings.items()}
        key = json.dumps([source, tags], sort_keys=True)
        if key in seen:
            return
        seen.add(key)
        expected = evaluate_expression(source, tags)
        normative = ["result", "code"]
        cases.append(
            {
                "id": f"{group}/{len(cases):04d}",
                "input": {"source": source, "bindings": tags},
                "expected": expected,
                "normative": normative,
                "informative": ["position"] if expected["result"] == "error" else [],
            }
        )

    for source, bindings in _EVALUATIONS:
        add("evaluate", source, bindings)
    for op in ("and", "or"):
        for p_name, p_value in _KLEENE.items():
            for q_name, q_value in _KLEENE.items():
                bindings = {k: v for k, v in (("p", p_value), ("q", q_value)) if v is not None}
                add(f"kleene_{op}_{p_name}{q_name}", f"p {op} q", bindings)
    for p_value in _KLEENE.values():
        add("kleene_not", "not p", {} if p_value is None else {"p": p_value})
    for source in _REFUSED_SOURCES:
        add("refuse", source, {})
    for source in _BOUNDARY_SOURCES:
        add("limit", source, {"a": 1, "x" * 1000: True})
    return cases
