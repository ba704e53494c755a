"""The distribution installs like one: built, checked, installed into a fresh environment, and used there.

One test, because building and installing is the slow part (marked ``wheel``;
``pytest -m 'not wheel'`` leaves it out): ``python -m build`` makes the sdist
and the wheel; their metadata is checked (SPDX license and its file,
classifiers, URLs, the console script); the wheel is installed into a new
virtual environment in a temporary directory outside the repository, with
nothing of the repository on its path; and there ``fencekeeper --version``,
``python -m fencekeeper``, ``fencekeeper export-specs``, ``fencekeeper demo``
and a short script through ``fencekeeper.connect`` run as a user would run
them.
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''
import sys
from pathlib import Path

import fencekeeper
from fencekeeper.adapters import examples

definition = """
id = "hello"
revision = 1
start = "greet"
inputs = ["name"]

[[nodes]]
id = "greet"
kind = "end"
revision = 1
outcome = "succeeded"
"""
policy = examples.grants("default", "user:operator")
with fencekeeper.connect("script.db", policy=policy, handler=examples.handler()) as client:
    execution = client.run(definition, {"name": "world"}, execution_id="hello-1")
    client.run_until_idle()
    state = client.get("hello-1").state
    try:
        client.cancel("hello-1")
    except fencekeeper.Refused as refused:
        code = refused.code.value
print(fencekeeper.__version__, state.value, code, Path(fencekeeper.__file__).parent)
'''


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.wheel
def test_build_install_and_use_the_wheel(tmp_path: Path) -> None:
    assert ROOT not in tmp_path.resolve().parents
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], cwd=tmp_path, env=env, timeout=300)
    assert "BuildBackendWarning" not in built.stderr and "deprecated" not in built.stderr.lower(), built.stderr
    (wheel,) = dist.glob("fencekeeper-*-py3-none-any.whl")
    (sdist,) = dist.glob("fencekeeper-*.tar.gz")

    # --- metadata and contents --------------------------------------------------------------
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(info).decode("utf-8"))
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode("utf-8")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE" and any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "fencekeeper.connect" in (metadata.get_payload() or "")  # the README is the long description
    assert {e.strip() for e in metadata.get_all("Provides-Extra") or []} >= {"metrics", "tracing", "dev"}
    classifiers = metadata.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and not any(c.startswith("License ::") for c in classifiers)
    # No project URLs until the project has a published home: an invented one would mislead.
    assert not metadata.get_all("Project-URL")
    for shipped in ("fencekeeper/specs/journal/fixtures/manifest.json", "fencekeeper/specs/machines/node.toml"):
        assert shipped in names, shipped
    assert "fencekeeper = fencekeeper.adapters.cli:main" in entry_points
    for shipped in ("fencekeeper/__init__.py", "fencekeeper/__main__.py", "fencekeeper/py.typed",
                    "fencekeeper/kernel/py.typed", "fencekeeper/adapters/client.py"):
        assert shipped in names
    specs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "specs").rglob("*") if p.is_file())
    assert [f"fencekeeper/{s}" for s in specs if f"fencekeeper/{s}" not in names] == []
    assert not any(n.startswith(("tests/", "bench/", "docs/")) for n in names)
    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    assert {"LICENSE", "pyproject.toml", "README.md", "specs/protocol.md", "api/__init__.py"} <= members

    # --- a fresh environment, outside the repository ------------------------------------------
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], cwd=tmp_path,
         env=env, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    version = _run([str(venv / "bin" / "fencekeeper"), "--version"], cwd=work, env=env).stdout.strip()
    assert version == f"fencekeeper {metadata['Version']}"
    assert _run([str(python), "-m", "fencekeeper", "--version"], cwd=work, env=env).stdout.strip() == version
    _run([str(venv / "bin" / "fencekeeper"), "export-specs", "exported"], cwd=work, env=env)
    for relative in specs:
        exported = work / "exported" / Path(relative).relative_to("specs")
        assert exported.read_bytes() == (ROOT / relative).read_bytes(), relative
    demo = _run([str(venv / "bin" / "fencekeeper"), "demo", "--db", "demo.db"], cwd=work, env=env, timeout=120)
    assert "REFUSED [lease_expired]" in demo.stdout and "REFUSED [lease_token_mismatch]" in demo.stdout
    (work / "script.py").write_text(SCRIPT, encoding="utf-8")
    out = _run([str(python), "script.py"], cwd=work, env=env).stdout.split()
    assert out[:3] == [metadata["Version"], "succeeded", "illegal_transition"]
    # The package came from the fresh environment, not from the repository.
    assert Path(out[3]).is_relative_to(venv) and not Path(out[3]).resolve().is_relative_to(ROOT)
