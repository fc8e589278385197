"""What an API key may propose: its scopes.

A scope is `*` (every capability), a capability id (`refund-order-v2`), the permission a
capability's contract names (`payments.refund`), or a group of permissions (`payments.*`).
The contracts live a layer up, in toolcalls, which registers each one here as it is defined
(`register`), so a key is never issued with a scope that names nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

EVERY_CAPABILITY = "*"

# capability id -> the permission its contract names
_CAPABILITIES: dict[str, str] = {}
# Scopes for reads that are not capabilities (`eval:read`), registered by the app that checks
# them. `*` does not include them: a key gets each one by name.
_READ_SCOPES: set[str] = set()


def register_read_scope(scope: str) -> None:
    _READ_SCOPES.add(scope)


def register(capability_id: str, permission: str) -> None:
    _CAPABILITIES[capability_id] = permission


def covers(scopes: Iterable[str], *, capability_id: str, permission: str) -> bool:
    for scope in scopes:
        if scope == EVERY_CAPABILITY or scope in (capability_id, permission):
            return True
        if scope.endswith(".*") and permission.startswith(scope[:-1]):
            return True
    return False


def scope_problem(scope: str) -> str | None:
    """Why `scope` can never match a registered capability, or None when it can."""
    permissions = set(_CAPABILITIES.values())
    if scope in _READ_SCOPES:
        return None
    if scope == EVERY_CAPABILITY or scope in _CAPABILITIES or scope in permissions:
        return None
    group = scope.removesuffix("*")
    if scope.endswith(".*") and any(permission.startswith(group) for permission in permissions):
        return None
    return (
        f"Scope {scope!r} names no capability, permission or permission group; use a capability "
        f"id, a permission such as {min(permissions, default='payments.refund')!r}, a group "
        "such as 'payments.*', or '*' for every capability."
    )


def known_scopes() -> list[str]:
    """Every scope a key may name, for a form to offer: `*`, each permission group and
    permission, each capability id, then the read scopes."""
    permissions = sorted(set(_CAPABILITIES.values()))
    groups = sorted({permission.split(".")[0] + ".*" for permission in permissions})
    return [EVERY_CAPABILITY, *groups, *permissions, *sorted(_CAPABILITIES), *sorted(_READ_SCOPES)]


def within(scope: str, granted: Iterable[str]) -> bool:
    """Whether `scope` asks for nothing beyond `granted`: a credential's scope must be within
    its minting key's. Read scopes (`eval:read`) only by name, like `*` itself."""
    granted = list(granted)
    if scope in granted:
        return True
    if scope == EVERY_CAPABILITY or scope in _READ_SCOPES:
        return False
    if scope in _CAPABILITIES:
        return covers(granted, capability_id=scope, permission=_CAPABILITIES[scope])
    # A permission or a group of them: within `*`, or within a wider group (`payments.*`).
    prefix = scope.removesuffix("*")
    return any(
        g == EVERY_CAPABILITY or (g.endswith(".*") and prefix.startswith(g[:-1])) for g in granted
    )
