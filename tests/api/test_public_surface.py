"""The public modules say what they export, and every public name says what it is.

A module is public when a user is meant to import from it: the front door,
the kernel and its protocol, and the adapters a deployment plugs into or
calls (the client, its exceptions, the ports, the service operations, the
store port, the worker, opening a store, the examples, what operators watch).
The journal and the two model checkers are held to the same rules: the
kernel is read as a reference, and they are where a reader learns the
journal's records and what the proofs explore.  For each:

- ``__all__`` exists, lists only names the module has, and lists every class
  and function the module itself defines that does not start with ``_``;
- every class and function it exports, and every public method and property
  of those classes, has a docstring (an attrs class's generated signature
  does not count).

The API reference (``docs/api``) is generated from exactly these docstrings.
"""

from __future__ import annotations

import enum
import importlib
import inspect
from types import ModuleType

import pytest

PUBLIC = (
    "fencekeeper",
    "fencekeeper.kernel",
    "fencekeeper.kernel.machines",
    "fencekeeper.kernel.protocol",
    "fencekeeper.kernel.recovery",
    "fencekeeper.kernel.operations",
    "fencekeeper.kernel.approvals",
    "fencekeeper.kernel.interpreter",
    "fencekeeper.kernel.definition",
    "fencekeeper.kernel.events",
    "fencekeeper.kernel.evidence",
    "fencekeeper.kernel.errors",
    "fencekeeper.kernel.journal",
    "fencekeeper.kernel.modelcheck",
    "fencekeeper.kernel.opsmodel",
    "fencekeeper.adapters.client",
    "fencekeeper.adapters.aio",
    "fencekeeper.adapters.errors",
    "fencekeeper.adapters.ports",
    "fencekeeper.adapters.service",
    "fencekeeper.adapters.store",
    "fencekeeper.adapters.worker",
    "fencekeeper.adapters.connect",
    "fencekeeper.adapters.examples",
    "fencekeeper.adapters.observe",
)


def _documented(value: object) -> bool:
    # A class's own docstring: inspect.getdoc would take an enum's from Enum
    # or from its base (TableEnum's), which says nothing about the class.
    doc = (value.__doc__ if inspect.isclass(value) else inspect.getdoc(value)) or ""
    if inspect.isclass(value) and doc.startswith(f"{value.__name__}("):
        return False  # attrs/dataclass's generated signature is not documentation
    return bool(doc.strip())


def _members(cls: type) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            found.append((name, member.fget))
        elif isinstance(member, (classmethod, staticmethod)):
            found.append((name, member.__func__))
        elif inspect.isfunction(member):
            found.append((name, member))
    return found


def undocumented(module: ModuleType) -> list[str]:
    missing: list[str] = []
    for name in module.__all__:
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if not _documented(value):
            missing.append(name)
        if inspect.isclass(value) and not issubclass(value, enum.Enum) and value.__module__.startswith("fencekeeper"):
            missing += [f"{name}.{m}" for m, f in _members(value) if not (inspect.getdoc(f) or "").strip()]
    return missing


@pytest.mark.parametrize("name", PUBLIC)
def test_all_is_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    for listed in exported:
        assert hasattr(module, listed), f"{name}.__all__ lists {listed!r}, which it does not have"
    defined = [
        key
        for key, value in vars(module).items()
        if not key.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == name
    ]
    assert [key for key in defined if key not in exported] == [], f"{name} defines public names not in __all__"


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_docstring(name: str) -> None:
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip(), f"{name} has no module docstring"
    assert undocumented(module) == []


def test_the_checker_sees_a_missing_docstring() -> None:
    fake = ModuleType("fencekeeper.fake")

    class Thing:
        """Documented."""

        def act(self) -> None:
            pass

    Thing.__module__ = "fencekeeper.fake"
    fake.Thing = Thing  # type: ignore[attr-defined]
    fake.__all__ = ["Thing"]  # type: ignore[attr-defined]
    assert undocumented(fake) == ["Thing.act"]


def test_every_public_function_of_every_kernel_module_says_what_it_does() -> None:
    # The kernel is read as a reference: beyond the modules above, each of its
    # modules' exported functions has a docstring (the classes of the modules in
    # PUBLIC are held to it above; the others' are not all yet).
    import pkgutil  # noqa: PLC0415

    from fencekeeper import kernel  # noqa: PLC0415

    missing = []
    for info in pkgutil.iter_modules(kernel.__path__):
        module = importlib.import_module(f"fencekeeper.kernel.{info.name}")
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not _documented(value):
                missing.append(f"{info.name}.{name}")
    assert missing == []


def test_the_checker_does_not_take_an_inherited_docstring() -> None:
    fake = ModuleType("fencekeeper.fake")

    class Colour(enum.Enum):
        RED = "red"

    fake.Colour = Colour  # type: ignore[attr-defined]
    fake.__all__ = ["Colour"]  # type: ignore[attr-defined]
    assert undocumented(fake) == ["Colour"]


def test_the_kernel_exports_machines_step_and_the_protocol() -> None:
    from fencekeeper import kernel  # noqa: PLC0415
    from fencekeeper.kernel import protocol  # noqa: PLC0415

    for name in ("EXECUTION", "MACHINES", "step", "recover", "Decision", "Refusal", "Unchanged", "Guard", "RefusalCode"):
        assert name in kernel.__all__
    requests = [n for n in protocol.__all__ if n.endswith("Request")]
    decisions = ["admit", "claim", "renew", "record_step", "release", "finalize", "wake", "cancel"]
    assert len(requests) >= 9
    assert all(n in kernel.__all__ for n in requests + decisions)
