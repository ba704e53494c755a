"""The canonical text an input is digested from is the one specs/operations.md ("Equal input") spells out.

Another implementation computes the digest from the spec alone, and a submission of the same value through
it must be the same submission: every rule of the spec's list is held here by an example it names.
"""

from __future__ import annotations

import pytest

from fencekeeper.adapters.operations.service import canonical_json, input_digest


@pytest.mark.parametrize(
    ("value", "text"),
    [
        # Members by their keys' code points: U+FFFF before U+10000, which UTF-16 order puts first.
        ({"\U00010000": 1, "\uffff": 2, "b": 3, "B": 4}, '{"B":4,"b":3,"\uffff":2,"\U00010000":1}'),
        (["\x01\x1f\b\t\n\f\r", '"\\'], '["\\u0001\\u001f\\b\\t\\n\\f\\r","\\"\\\\"]'),
        (["/\x7f\u2028\u2029é"], '["/\x7f\u2028\u2029é"]'),
        ([1.0, -0.0, 1e20, -3], "[1,0,100000000000000000000,-3]"),
        (1e300, str(int(1e300))),
        ([0.5, 0.0001, -123.456, 1e-05, -1.5e-07, 5e-324], "[0.5,0.0001,-123.456,1e-05,-1.5e-07,5e-324]"),
        ({"a": [True, False, None], "b": {}}, '{"a":[true,false,null],"b":{}}'),
    ],
)
def test_the_canonical_text_is_the_one_the_spec_writes(value: object, text: str) -> None:
    assert canonical_json(value) == text


def test_the_digest_is_the_sha256_of_the_canonical_utf8_text() -> None:
    assert input_digest(canonical_json({"amount": 1.0})) == (
        "c2b11e657e12fd177359627ca89412018e2274d0873cfbfcf1fc50f685582e9e"  # sha-256 of {"amount":1}
    )
