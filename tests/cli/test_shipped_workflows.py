"""The teaching workflows the demo runs are shipped in the package, byte for byte as documented.

docs/examples is not installed, so ``adapters/workflows`` carries copies; a
copy that drifted from the page readers are shown would make the demo teach
something else.
"""

from __future__ import annotations

import importlib.resources

import pytest

from fencekeeper.adapters.demo import workflow_text
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import EXAMPLES, ROOT

SHIPPED = ROOT / "adapters" / "workflows"


def test_the_same_files_are_shipped_and_documented() -> None:
    assert sorted(p.name for p in SHIPPED.glob("*.toml")) == sorted(p.name for p in EXAMPLES.glob("*.toml"))


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_shipped_copy_is_byte_identical(name: str) -> None:
    assert (SHIPPED / name).read_bytes() == (EXAMPLES / name).read_bytes(), (
        f"adapters/workflows/{name} differs from docs/examples/{name}; copy it over"
    )
    installed = importlib.resources.files("fencekeeper.adapters") / "workflows" / name
    assert installed.read_bytes() == (EXAMPLES / name).read_bytes(), "the installed copy is stale; reinstall"
    parse_definition(workflow_text(name), name)
