"""docs/concepts.md teaches what it promises, and its self-check answers follow the machines.

- the page has a section for each question a learner brings (why leases
  alone fail, what the fence adds, what the guard buys, where the guarantee
  stops, the two recovery policies, how others compare), and the
  comparison names Temporal, DBOS and Postgres job queues;
- the self-check at its end asks the five questions a newcomer should be
  able to answer, each with an answer;
- the answer to "how does an execution leave every non-terminal state" has
  a bullet for every non-terminal state of the execution and operation
  machines, naming every event that leaves it, so a row added to a
  machine's table fails here until the answer says how that state is left.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencekeeper.kernel import MACHINES

CONCEPTS = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"


def _page() -> str:
    return CONCEPTS.read_text(encoding="utf-8")


def _answers() -> dict[str, str]:
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"<details><summary>(.+?)</summary>\n(.*?)</details>", _page(), re.S)
    }


def test_a_section_for_each_question_and_the_comparison_names_its_peers() -> None:
    headings = re.findall(r"^## \d\. (.+)$", _page(), re.M)
    for topic in ("lease alone", "fencing token", "guard", "external effects", "recovery policies", "others"):
        assert any(topic in h for h in headings), (topic, headings)
    comparison = _page().split("## 7.", 1)[1].split("## Self-check", 1)[0]
    for peer in ("Temporal", "DBOS", "Postgres job queues", "durable operations", "workflow executions"):
        assert peer in comparison, peer


def test_the_self_check_asks_the_five_questions_with_answers() -> None:
    questions = list(_answers())
    for asked in ("Why does the fence exist", "late write", "late Command", "expired lease", "guard", "non-terminal"):
        assert any(asked in q for q in questions), (asked, questions)
    assert all(len(answer.split()) > 20 for answer in _answers().values())


@pytest.mark.parametrize("machine", ["execution", "operation"])
def test_every_non_terminal_state_is_answered_with_every_way_out(machine: str) -> None:
    answer = next(a for q, a in _answers().items() if "non-terminal" in q)
    # From this machine's link to the next machine's (or the end).
    part = answer.split(f"(machines.md#{machine})", 1)[1].split("(machines.md#", 1)[0]
    bullets = {m.group(1): m.group(2) for m in re.finditer(r"^- `(\w+)`: (.*?)(?=^- `|^\S|\Z)", part, re.S | re.M)}
    spec = MACHINES[machine].spec
    for state in spec.states:
        if state in spec.terminal:
            continue
        assert state in bullets, f"{machine}: no bullet says how `{state}` is left"
        named = set(re.findall(r"`(\w+)`", bullets[state]))
        leaving = {t.event for t in spec.transitions if t.source == state}
        assert leaving <= named, f"{machine} `{state}`: the answer does not name {sorted(leaving - named)}"
