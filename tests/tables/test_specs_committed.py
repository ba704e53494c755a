"""The committed specs are exactly the kernel's tables, byte for byte.

The kernel keeps its tables as literal data (it may not read files); the
TOML under specs/machines/ is their language-neutral export.  These tests
make the two impossible to drift apart.
"""

from __future__ import annotations

import pytest

from fencekeeper.kernel import MACHINES, render_machine_spec

from .oracle import SPECS, committed_spec


@pytest.mark.parametrize("name", list(MACHINES))
def test_committed_toml_is_the_export(name: str) -> None:
    committed = (SPECS / f"{name}.toml").read_text(encoding="utf-8")
    assert committed == render_machine_spec(MACHINES[name].spec), (
        f"specs/machines/{name}.toml differs from kernel/machines.py; run `make specs`"
    )


@pytest.mark.parametrize("name", list(MACHINES))
def test_committed_toml_parses_to_the_kernel_spec(name: str) -> None:
    assert committed_spec(name) == MACHINES[name].spec


def test_no_stray_spec_files() -> None:
    assert sorted(p.stem for p in SPECS.glob("*.toml")) == sorted(MACHINES)
