"""docs/operations.md's Python, run as a reader would paste it: actions, resolvers, the service, a worker.

The page's blocks are taken from the page itself, in order, and run in one
namespace; only what the page leaves to the reader (its user directory) is
given here.  A block that stops working, or an import it forgets, fails.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_pages_first_steps_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = _blocks()
    actions, resolvers, service, worker = blocks[:4]
    assert "DurableAction(" in actions and "register(" in resolvers
    assert "service.submit(" in service and "DurableOperationWorker(" in worker
    users = {"alice": SimpleNamespace(tenants={"acme"})}
    namespace: dict[str, Any] = {"my_directory": SimpleNamespace(get=users.get, down=False)}
    for block in (actions, resolvers, service, worker):
        exec(compile(block, str(PAGE), "exec"), namespace)  # the page's own code, as a reader runs it
    admission = namespace["admission"]
    assert admission.created
    record = namespace["service"].get(admission.operation_id)
    # The page cancels before its worker runs: the worker finds nothing, and the operation stays cancelled.
    assert record.state.value == "cancelled"
    assert namespace["service"].get(admission.operation_id, tenant="elsewhere") is None
