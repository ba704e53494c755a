"""The shipped operation store suite, run as docs/conformance.md (The operation store suite) tells a third party to.

The section's two examples are taken from the page as written: the factory
module and the ``pytest --pyargs ... --fencekeeper-operation-store`` line,
and the ``OperationStoreTests`` subclass.  ``mystore`` is a package made
here whose ``MyOperationStore`` is the in-memory operation store (or, to
show that the run really tests the store it is given, one that forgets
idempotency identities).  Each run is a pytest run in this process, as a
third party's would be in theirs.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8").split("## The operation store suite", 1)[1]

CORRECT = """\
from fencekeeper.adapters.operations.memory import MemoryOperationStore


def MyOperationStore(path, clock):
    return MemoryOperationStore(clock)
"""

FORGETS_IDENTITIES = """\
import contextlib

from fencekeeper.adapters.operations.memory import MemoryOperationStore


class _Forgetful(MemoryOperationStore):
    @contextlib.contextmanager
    def _transaction(self):
        with super()._transaction() as tx:
            tx.lock_identity = lambda identity: None  # every submission looks new
            yield tx


def MyOperationStore(path, clock):
    return _Forgetful(clock)
"""


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.DOTALL)


class _Reports:
    def __init__(self) -> None:
        self.passed: list[str] = []
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.passed and report.when == "call":
            self.passed.append(report.nodeid)
        elif report.failed:
            self.failed.append(report.nodeid)


@contextmanager
def _third_party(tmp_path: Path, store: str) -> Iterator[Path]:
    """``mystore`` (with the page's ``testing.py``) and the page's test module, importable, then forgotten."""
    package = tmp_path / "mystore"
    package.mkdir()
    (package / "__init__.py").write_text(store, encoding="utf-8")
    factory, subclass = _blocks("python")
    assert factory.startswith("# mystore/testing.py\n")
    (package / "testing.py").write_text(factory, encoding="utf-8")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_mystore.py").write_text(subclass, encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tests
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "mystore" or n.startswith(("mystore.", "test_mystore"))]:
            del sys.modules[name]


def _run(args: list[str], tmp_path: Path) -> _Reports:
    reports = _Reports()
    tmp_path.mkdir(exist_ok=True)
    pytest.main([*args, "-qq", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "basetemp")], plugins=[reports])
    return reports


def _command_line() -> list[str]:
    (line,) = _blocks("sh")
    words = shlex.split(line)
    assert words[0] == "pytest"
    return words[1:]


def test_both_documented_routes_run_the_whole_suite_against_a_correct_store(tmp_path: Path) -> None:
    from fencekeeper.adapters.testing import OperationStoreTests  # noqa: PLC0415 - what the page imports

    expected = len([name for name in dir(OperationStoreTests) if name.startswith("test_")])
    with _third_party(tmp_path, CORRECT) as tests:
        by_option = _run(_command_line(), tmp_path / "a")
        by_subclass = _run([str(tests / "test_mystore.py"), "--rootdir", str(tmp_path)], tmp_path / "b")
    for route, reports in (("--fencekeeper-operation-store", by_option), ("OperationStoreTests subclass", by_subclass)):
        assert reports.failed == [], (route, reports.failed)
        # Every test of the suite ran (parametrized ones more than once), the state machine among them.
        ran = {nodeid.split("::")[-1].split("[")[0] for nodeid in reports.passed}
        assert len(ran) == expected >= 20, (route, sorted(ran))
        assert "test_service_state_machine_keeps_the_invariants" in ran


def test_the_suite_fails_a_store_that_forgets_identities(tmp_path: Path) -> None:
    with _third_party(tmp_path, FORGETS_IDENTITIES):
        reports = _run([*_command_line(), "-k", "identical_submission"], tmp_path / "a")
    assert reports.passed == []
    assert [nodeid.split("::")[-1] for nodeid in reports.failed] == ["test_identical_submission_is_the_same_operation"]


def test_a_bad_operation_store_option_is_one_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = pytest.main(
        ["--pyargs", "fencekeeper.adapters.testing.run_operations_suite", "--fencekeeper-operation-store",
         "no_such_module:make", "-qq", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t")]
    )  # fmt: skip
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--fencekeeper-operation-store no_such_module:make" in capsys.readouterr().err
    # Without any factory, the suite says how to give one instead of running against nothing.
    reports = _run(["--pyargs", "fencekeeper.adapters.testing.run_operations_suite", "-k", "identical"], tmp_path)
    assert reports.passed == [] and len(reports.failed) == 1
