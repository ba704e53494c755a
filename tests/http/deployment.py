"""A deployment's HTTP configuration for the tests: its authentication, its registry and its executions policy.

Both ``--auth`` and ``--actions`` of ``fencekeeper serve`` (``authenticate``,
``policy``; ``registry``, ``resolvers``).  alice and carol act in tenant acme and
bob in beta; mallory authenticates (as acme) but belongs to no tenant, so every
change she asks for is refused by the current resolution (403).
"""

from __future__ import annotations

from fencekeeper.adapters import examples as execution_examples
from fencekeeper.adapters.http import BearerTokens, HttpPrincipal
from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.service import (
    DurableActionRegistry,
    PrincipalReference,
    PrincipalResolverRegistry,
    ResolutionStatus,
)
from fencekeeper.adapters.ports import GrantTable

ALICE = HttpPrincipal(PrincipalReference("users", 1, "alice"), "acme")
BOB = HttpPrincipal(PrincipalReference("users", 1, "bob"), "beta")
CAROL = HttpPrincipal(PrincipalReference("users", 1, "carol"), "acme")
MALLORY = HttpPrincipal(PrincipalReference("users", 1, "mallory"), "acme")
TOKENS = {"alice-token": ALICE, "bob-token": BOB, "carol-token": CAROL, "mallory-token": MALLORY}

authenticate = BearerTokens(TOKENS)


def registry() -> DurableActionRegistry:
    return examples.registry()


def resolvers() -> PrincipalResolverRegistry:
    directory = examples.Directory()
    directory.set("alice", ResolutionStatus.ACTIVE, frozenset({"acme"}))
    directory.set("bob", ResolutionStatus.ACTIVE, frozenset({"beta"}))
    directory.set("carol", ResolutionStatus.ACTIVE, frozenset({"acme"}))
    directory.set("mallory", ResolutionStatus.ACTIVE, frozenset())
    registry = PrincipalResolverRegistry()
    registry.register("users", 1, directory)
    return registry


def policy() -> GrantTable:
    """Executions: alice everything in acme, bob everything in beta; mallory nothing."""
    table = execution_examples.grants("acme", ALICE.executions_principal)
    table.grant(BOB.executions_principal, "beta")
    return table
