"""How much the stateful test tries: named budgets, and how a run chooses one.

Rules of this module:

- A budget is a number of Hypothesis examples (fresh stores) and of
  requests per example.  ``default`` is what every local test run pays;
  ``ci`` is large enough that the broken stores of tests/conformance/broken
  that only a sequence of requests exposes are caught on every run, not on
  some (docs/conformance.md gives the measurements); ``quick`` is for the
  broken-store check, which runs the suite once per broken store.
- A run chooses, first match wins: :func:`choose` (the pytest plugin's
  ``--fencekeeper-budget``), then the ``FENCEKEEPER_SUITE_BUDGET``
  environment variable, then ``default``.  A choice is a name above or
  ``EXAMPLESxSTEPS`` (``500x120``).  A bad choice is one error naming the
  option and the accepted forms, raised before anything runs.
"""

from __future__ import annotations

import os
import re

import attrs
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings

ENV = "FENCEKEEPER_SUITE_BUDGET"


@attrs.frozen
class Budget:
    """How many examples (a fresh store each) the stateful test runs, and how many requests each."""

    examples: int
    steps: int

    def __str__(self) -> str:
        return f"{self.examples}x{self.steps}"


BUDGETS = {
    "quick": Budget(10, 40),
    "default": Budget(30, 60),
    "ci": Budget(200, 100),
}

_FORM = re.compile(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,4})")
_chosen: Budget | None = None


def parse(text: str, source: str = ENV) -> Budget:
    """A budget from its name or ``EXAMPLESxSTEPS``; ValueError naming ``source`` otherwise."""
    text = text.strip()
    if text in BUDGETS:
        return BUDGETS[text]
    match = _FORM.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{source}: {text!r} is not a budget; give one of {', '.join(BUDGETS)} or EXAMPLESxSTEPS (e.g. 500x120)"
        )
    return Budget(int(match.group(1)), int(match.group(2)))


def choose(budget: Budget | str | None) -> None:
    """Set the budget for this process (None: back to the environment or ``default``)."""
    global _chosen  # noqa: PLW0603 - one choice per process, made by the plugin at start-up
    _chosen = parse(budget, "--fencekeeper-budget") if isinstance(budget, str) else budget


def chosen() -> Budget:
    """The budget this run uses."""
    if _chosen is not None:
        return _chosen
    text = os.environ.get(ENV)
    return parse(text) if text else BUDGETS["default"]


def stateful_settings(budget: Budget | None = None) -> hypothesis_settings:
    """Hypothesis settings for the stateful test under ``budget`` (the chosen one by default).

    Shrinking is off (see ``stateful.DEFAULT_SETTINGS``), and so is the
    deadline: a database store's first request in a fresh file may take
    longer than Hypothesis's default allows.
    """
    budget = budget if budget is not None else chosen()
    return hypothesis_settings(
        max_examples=budget.examples,
        stateful_step_count=budget.steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
    )


__all__ = ["BUDGETS", "ENV", "Budget", "choose", "chosen", "parse", "stateful_settings"]
