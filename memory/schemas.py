"""Checkpoint schemas: migrations registered in code per kind and schema version, and the
fields no checkpoint may hold.

An agent writes a checkpoint at the schema version it knows (`schema_version: 1`). When its
kind's shape changes, register a migration from each old version to the next, as events
register upcasters (runs/events.py):

    register_migration("refund-agent", 1, lambda body: {**body, "data": {...}})

A read walks the steps from the stored version to the latest registered one (or the version
the reader asks for). A step gets a copy of the whole body and returns it changed; whatever
it does not know it returns untouched, so unknown fields are kept. A stored version with no
registered path to the target is refused with `checkpoint.no_migration_path` — never guessed
(that includes a version newer than the target: there are no downgrades).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from memory import errors
from runs.errors import DomainError

Migration = Callable[[dict[str, Any]], dict[str, Any]]

# (kind, from_version) -> the step to from_version + 1.
MIGRATIONS: dict[tuple[str, int], Migration] = {}


def register_migration(kind: str, from_version: int, migration: Migration) -> None:
    key = (kind, from_version)
    if key in MIGRATIONS and MIGRATIONS[key] is not migration:
        raise ValueError(f"{kind} v{from_version} already has a migration")
    MIGRATIONS[key] = migration


def latest_version(kind: str) -> int | None:
    """The newest schema version the code can migrate `kind` to; None when it has none."""
    targets = [version + 1 for (name, version) in MIGRATIONS if name == kind]
    return max(targets) if targets else None


def migrate(
    kind: str, version: int, body: dict[str, Any], target: int | None = None
) -> tuple[int, dict[str, Any]]:
    """(the version reached, the body at it). `target` defaults to the latest registered
    version of the kind, or the stored one when the kind has no migrations."""
    if target is None:
        target = latest_version(kind) or version
    if version > target:
        raise _no_path(kind, version, target, "it was written by a newer schema")
    body = copy.deepcopy(body)
    while version < target:
        step = MIGRATIONS.get((kind, version))
        if step is None:
            raise _no_path(kind, version, target, f"no migration from v{version} is registered")
        body = step(body)
        version += 1
    return version, body


def _no_path(kind: str, version: int, target: int, why: str) -> DomainError:
    return DomainError(
        errors.CHECKPOINT_NO_MIGRATION_PATH,
        f"A {kind!r} checkpoint at schema v{version} cannot be read as v{target}: {why}. "
        "Register the missing migration (memory/schemas.py), or read it at its own version "
        f"(?schema_version={version}).",
        status=409,
    )


# Raw chain-of-thought is not persisted (seed 002, "Durable checkpoints": for safety and
# determinism). Store what was decided instead: POST /api/v1/runs/{id}/decisions.
CHAIN_OF_THOUGHT_NAMES = frozenset(
    {
        "reasoning",
        "chain_of_thought",
        "chainofthought",
        "cot",
        "thoughts",
        "thought",
        "thinking",
        "scratchpad",
        "inner_monologue",
        "reasoning_trace",
        "reasoning_content",
    }
)


def _normalized(key: str) -> str:
    return key.strip().lower().replace("-", "_").replace(" ", "_")


def chain_of_thought_paths(value: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Every field, at any depth, named like chain-of-thought."""
    found: list[str] = []
    stack: list[tuple[tuple[str, ...], Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                here = (*where, str(key))
                if _normalized(str(key)) in CHAIN_OF_THOUGHT_NAMES:
                    found.append(".".join(here))
                stack.append((here, inner))
        elif isinstance(item, list):
            stack.extend(((*where, str(i)), inner) for i, inner in enumerate(item))
    return sorted(found)


def refuse_chain_of_thought(value: Any) -> None:
    paths = chain_of_thought_paths(value)
    if paths:
        raise DomainError(
            errors.CHECKPOINT_CHAIN_OF_THOUGHT,
            f"{', '.join(paths)}: a checkpoint does not keep chain-of-thought (it is neither "
            "safe nor deterministic to replay). Keep where you are and what you decided: "
            "record the judgment as a decision (POST /api/v1/runs/{run_id}/decisions) and "
            "cite its id in decision_ids.",
            status=422,
            details=[
                {"field": path, "problem": "chain-of-thought is not stored"} for path in paths
            ],
        )
