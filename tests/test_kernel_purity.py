"""The kernel is pure: no I/O, no clock, no randomness, no adapters.

The promise of ``kernel/`` is that every decision is a value computed from
its arguments, so the same inputs give the same answer in a test, in a
worker and in another implementation's conformance run.  That promise is
kept by what the kernel may import and call, so this module reads every
kernel source file with :mod:`ast` and refuses:

- any import outside an allow-list of pure standard-library modules and
  ``attrs`` (relative imports must stay inside the kernel);
- calls of the builtins that reach the world (``open``, ``print``, ...);
- attribute calls whose names read a clock or a file (``.now()``,
  ``.read_text()``, ...), whatever object they are called on.

A failure names the file, the line and what was imported or called.  The
checker is itself tested on small sources, and a subprocess confirms that
importing ``fencekeeper.kernel`` loads none of the modules it must not.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernel"
KERNEL_PACKAGE = "fencekeeper.kernel"

ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "enum",
        "typing",
        "collections",
        "collections.abc",
        "types",
        "functools",
        "itertools",
        # attrgetter and friends: functions over values, nothing else.
        "operator",
        "re",
        "datetime",
        "tomllib",
        "json",
        "hashlib",
        "math",
        "string",
        "dataclasses",
        "attrs",
        "attr",
        # RFC 8785 canonical JSON for the journal's codec: pure (its only
        # buffer is an in-memory BytesIO), no I/O, clock or randomness.
        "rfc8785",
    }
)
"""Modules the kernel may import; their submodules (``attr.validators``) too."""

FORBIDDEN_MODULES = frozenset(
    {
        "os",
        "sys",
        "io",
        "time",
        "random",
        "secrets",
        "uuid",
        "threading",
        "asyncio",
        "socket",
        "subprocess",
        "sqlite3",
        "psycopg",
        "psycopg2",
        "pathlib",
        "importlib",
        "logging",
        "argparse",
        "click",
        "typer",
        "sqlalchemy",
        "asyncpg",
        "fencekeeper.adapters",
        "adapters",
    }
)
"""Named explicitly so that the allow-list can never grow to include one of them
(see ``test_allow_list_excludes_every_forbidden_module``); anything else not
allow-listed is refused too."""

FORBIDDEN_BUILTIN_CALLS = frozenset({"open", "print", "input", "eval", "exec", "__import__"})
FORBIDDEN_ATTRIBUTE_CALLS = frozenset({"now", "utcnow", "today", "time", "monotonic", "read_text", "write_text"})


# --- the checker ------------------------------------------------------------------


def _module_allowed(name: str) -> bool:
    if name == KERNEL_PACKAGE or name.startswith(KERNEL_PACKAGE + "."):
        return True
    parts = name.split(".")
    return any(".".join(parts[:i]) in ALLOWED_MODULES for i in range(1, len(parts) + 1))


def find_impurities(source: str, filename: str, package_depth: int = 0) -> list[str]:
    """Every forbidden import or call in ``source``, as ``filename:line: problem``.

    ``package_depth`` is how many packages below ``kernel/`` the module sits
    (0 for ``kernel/spec.py``), which bounds how far a relative import may
    climb before it leaves the kernel.
    """
    problems: list[tuple[int, str]] = []

    def report(node: ast.stmt | ast.expr, problem: str) -> None:
        problems.append((node.lineno, f"{filename}:{node.lineno}: {problem}"))

    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _module_allowed(alias.name):
                    report(node, f"import {alias.name!r} is not allowed in the kernel")
        elif isinstance(node, ast.ImportFrom):
            dots = "." * node.level
            spelled = f"from {dots}{node.module or ''} import {', '.join(a.name for a in node.names)}"
            if node.level > package_depth + 1:
                # ``from ..adapters import x`` in kernel/spec.py climbs out of
                # the kernel into the ``fencekeeper`` namespace.
                report(node, f"{spelled!r} leaves the kernel")
            elif node.level == 0 and not _module_allowed(node.module or ""):
                report(node, f"{spelled!r} is not allowed in the kernel")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTIN_CALLS:
                report(node, f"call of {func.id}() is not allowed in the kernel")
            elif isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_ATTRIBUTE_CALLS:
                report(node, f"call of {ast.unparse(func)}() is not allowed in the kernel")
    # ast.walk is breadth-first; report in line order so the message reads like the file.
    return [problem for _line, problem in sorted(problems)]


def kernel_modules() -> list[Path]:
    return sorted(KERNEL.rglob("*.py"))


# --- the kernel as it is ----------------------------------------------------------------


def test_kernel_modules_are_found() -> None:
    # Guards the glob: a wrong path would make every purity test vacuous.
    names = {p.name for p in kernel_modules()}
    assert {"__init__.py", "machines.py", "spec.py", "errors.py"} <= names


@pytest.mark.parametrize("path", kernel_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_kernel_module_is_pure(path: Path) -> None:
    relative = path.relative_to(ROOT)
    depth = len(path.relative_to(KERNEL).parts) - 1
    problems = find_impurities(path.read_text(encoding="utf-8"), str(relative), package_depth=depth)
    assert not problems, "the kernel must stay pure (no I/O, clock, randomness or adapters):\n" + "\n".join(problems)


def test_allow_list_excludes_every_forbidden_module() -> None:
    for name in FORBIDDEN_MODULES:
        assert not _module_allowed(name), name


# --- the checker sees what it must -------------------------------------------------------------

IMPURE_SOURCE = """\
from __future__ import annotations

import time
import datetime

from fencekeeper.adapters import x


def stamp() -> object:
    return datetime.now()
"""


def test_checker_reports_import_clock_call_and_adapter_import() -> None:
    assert find_impurities(IMPURE_SOURCE, "kernel/bad.py") == [
        "kernel/bad.py:3: import 'time' is not allowed in the kernel",
        "kernel/bad.py:6: 'from fencekeeper.adapters import x' is not allowed in the kernel",
        "kernel/bad.py:10: call of datetime.now() is not allowed in the kernel",
    ]


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("import os", "import 'os'"),
        ("import os.path", "import 'os.path'"),
        ("import sys", "import 'sys'"),
        ("import random", "import 'random'"),
        ("import sqlite3", "import 'sqlite3'"),
        ("import psycopg", "import 'psycopg'"),
        ("import importlib", "import 'importlib'"),
        ("import collections, socket", "import 'socket'"),
        ("from pathlib import Path", "'from pathlib import Path'"),
        ("from uuid import uuid4", "'from uuid import uuid4'"),
        ("from adapters import cli", "'from adapters import cli'"),
        ("from fencekeeper.adapters.cli import main", "'from fencekeeper.adapters.cli import main'"),
        ("from ..adapters import cli", "'from ..adapters import cli' leaves the kernel"),
        ("from .. import adapters", "'from .. import adapters' leaves the kernel"),
        ("open('f')", "call of open()"),
        ("print('x')", "call of print()"),
        ("input()", "call of input()"),
        ("eval('1')", "call of eval()"),
        ("exec('x = 1')", "call of exec()"),
        ("__import__('os')", "call of __import__()"),
        ("datetime.datetime.utcnow()", "call of datetime.datetime.utcnow()"),
        ("date.today()", "call of date.today()"),
        ("clock.time()", "call of clock.time()"),
        ("clock.monotonic()", "call of clock.monotonic()"),
        ("path.read_text()", "call of path.read_text()"),
        ("path.write_text('x')", "call of path.write_text()"),
        ("def f():\n    import time", "import 'time'"),
    ],
)
def test_checker_reports(source: str, problem: str) -> None:
    problems = find_impurities(source, "kernel/x.py")
    assert len(problems) == 1, problems
    assert problem in problems[0]
    assert problems[0].startswith("kernel/x.py:")


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations",
        "import enum",
        "import collections.abc",
        "from collections.abc import Mapping",
        "from types import MappingProxyType",
        "import attrs",
        "from attr import validators",
        "import attr.validators",
        "import tomllib",
        "from json import loads",
        "from datetime import datetime, timedelta",
        "from . import errors",
        "from .errors import InvalidSpec",
        "from fencekeeper.kernel.errors import InvalidSpec",
        # Reading a field called ``time`` or passing a timestamp is fine; only
        # calling something that reads a clock is not.
        "deadline = lease.time",
        "expired = now >= lease.expires_at",
        "text = render(spec)",
    ],
)
def test_checker_accepts(source: str) -> None:
    assert find_impurities(source, "kernel/x.py") == []


def test_relative_import_depth_follows_the_module() -> None:
    # One package down, ``..`` is still the kernel; ``...`` is not.
    assert find_impurities("from ..errors import InvalidSpec", "kernel/sub/x.py", package_depth=1) == []
    assert find_impurities("from ...adapters import cli", "kernel/sub/x.py", package_depth=1) == [
        "kernel/sub/x.py:1: 'from ...adapters import cli' leaves the kernel"
    ]


# --- what importing the kernel loads ---------------------------------------------------------

# Modules a pure kernel has no business loading.  Each was confirmed absent
# after ``import fencekeeper.kernel`` before being listed.  ``threading`` is
# deliberately missing: attrs imports it (``attr._compat``) for its own lock,
# so the kernel cannot keep it out; the AST check above still forbids the
# kernel itself from importing it.
MUST_NOT_LOAD = (
    "fencekeeper.adapters",
    "sqlite3",
    "psycopg",
    "psycopg2",
    "socket",
    "subprocess",
    "random",
    "secrets",
    "uuid",
    "asyncio",
    "logging",
    "pathlib",
    "argparse",
    "transitions",
    "graphviz",
)

_PROBE = """
import json, sys
before = set(sys.modules)
import fencekeeper.kernel
print(json.dumps({"before": sorted(before), "after": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def loaded_by_kernel_import(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    # A fresh interpreter (this test process has long since imported the
    # adapters), started outside the repository so that only the installed
    # package can be imported.
    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path_factory.mktemp("purity"),
    )
    probe = json.loads(result.stdout)
    return set(probe["before"]), set(probe["after"])


def test_kernel_import_loads_the_kernel(loaded_by_kernel_import: tuple[set[str], set[str]]) -> None:
    # Guards the probe: if the import silently did nothing, the absence checks would be vacuous.
    _before, after = loaded_by_kernel_import
    assert {"fencekeeper.kernel", "fencekeeper.kernel.machines", "fencekeeper.kernel.spec"} <= after


@pytest.mark.parametrize("module", MUST_NOT_LOAD)
def test_kernel_import_does_not_load(module: str, loaded_by_kernel_import: tuple[set[str], set[str]]) -> None:
    before, after = loaded_by_kernel_import
    assert module not in before, f"{module} is loaded at interpreter start-up; this check would prove nothing"
    loaded = sorted(m for m in after if m == module or m.startswith(module + "."))
    assert not loaded, f"import fencekeeper.kernel loaded {loaded}"


def test_kernel_import_loads_no_third_party_but_attrs(loaded_by_kernel_import: tuple[set[str], set[str]]) -> None:
    # Catches any database, CLI or network library, named above or not.
    before, after = loaded_by_kernel_import
    third_party = sorted(
        m
        for m in after - before
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in {"attr", "attrs", "fencekeeper"}
    )
    assert not third_party, f"import fencekeeper.kernel loaded {third_party}"
