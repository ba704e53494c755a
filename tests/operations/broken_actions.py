"""An ``--actions`` module with a plausible slip: ``registry()`` returns its actions bare, not in a registry.

A worker given it claimed an operation and only then failed on it, leaving the
Attempt running until its lease expired.
"""

from __future__ import annotations

from typing import Any

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.service import PrincipalResolverRegistry


def registry() -> Any:
    return (examples.TRANSFER,)


def resolvers() -> PrincipalResolverRegistry:
    return examples.resolvers()
