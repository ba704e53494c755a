"""An action module with nothing registered: what a deployment that forgot its actions looks like."""

from __future__ import annotations

from fencekeeper.adapters.operations.service import DurableActionRegistry, PrincipalResolverRegistry


def registry() -> DurableActionRegistry:
    return DurableActionRegistry()


def resolvers() -> PrincipalResolverRegistry:
    return PrincipalResolverRegistry()
