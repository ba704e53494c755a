"""docs/concepts.md's sequence diagrams are drawn from fresh runs of the scenarios they describe.

The committed page must hold exactly what a run of each scenario draws today
(``make specs`` rewrites the blocks), so a change to the protocol, the
worker or the drawing cannot leave a stale picture behind; and each picture
must show the moments its prose tells, so a scenario that quietly stopped
doing what the page says fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencekeeper.adapters import scenarios

CONCEPTS = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"


def _blocks(markdown: str) -> dict[str, str]:
    return {
        m.group("name"): m.group("body")
        for m in re.finditer(
            r"<!-- scenario: (?P<name>[a-z-]+) -->\n```mermaid\n(?P<body>.*?)```\n<!-- end scenario -->", markdown, re.S
        )
    }


def test_committed_diagrams_are_a_fresh_runs_diagrams() -> None:
    committed = CONCEPTS.read_text(encoding="utf-8")
    assert set(_blocks(committed)) == set(scenarios.SCENARIOS)
    fresh = scenarios.rewrite(committed)
    assert committed == fresh, "docs/concepts.md differs from a fresh run of its scenarios; run `make specs`"


def test_a_changed_diagram_is_seen() -> None:
    committed = CONCEPTS.read_text(encoding="utf-8")
    tampered = committed.replace("REFUSED lease_expired", "REFUSED lease_token_mismatch", 1)
    assert tampered != committed
    assert scenarios.rewrite(tampered) == committed


@pytest.mark.parametrize(
    ("name", "moments"),
    [
        (
            "fenced-out",
            [
                "lease fence 1",
                "REFUSED lease_expired",
                "quarantine_expired",
                "resume_safe",
                "lease fence 2",
                "REFUSED lease_token_mismatch",
                "rejected_conflict",
                "lease fence 3",
                "now succeeded",
            ],
        ),
        (
            "zombie-after-reconciliation",
            [
                "issued (fence 1)",
                "quarantine_expired",
                "reconcile r-1/a2/command (never execute)",
                "H-->>P1: rejected",
                "resume_safe",
                "issued (fence 2)",
                "H-->>W2: unknown",
                "H--xW1: rejected",
                "REFUSED dispatch_not_claimed",
                "H-->>P1: succeeded",
                "at refunded",
                "now succeeded",
            ],
        ),
        (
            "cancel-racing-a-claim",
            [
                "lease fence 1",
                "REFUSED stale_revision",
                "REFUSED cancel_running",
                "running -> waiting",
                "waiting -> cancelled",
                "closed by cancel",
                "now cancelled",
            ],
        ),
    ],
)
def test_each_picture_shows_what_its_prose_tells_in_order(name: str, moments: list[str]) -> None:
    diagram = _blocks(CONCEPTS.read_text(encoding="utf-8"))[name]
    positions = [diagram.find(moment) for moment in moments]
    assert -1 not in positions, [m for m, at in zip(moments, positions, strict=True) if at == -1]
    assert positions == sorted(positions)
