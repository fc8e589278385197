"""The soak's tenants: who they are in Countersign (people, an API key, a policy whose
approvals expire soon) and what they own at the sandbox (orders, warehouses, addresses).

The sandbox seeds acme and globex; a third tenant and more are seeded with its
`--extra-tenant` option. Connectors (COUNTERSIGN_CONNECTORS_FILE) give every tenant the
sandbox's endpoints and tokens, which the soak then looks for in the logs."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

SEEDED = ["acme", "globex"]
EXTRA = ["initech", "umbrella", "hooli", "vandelay", "wonka", "stark"]
SYSTEMS = ("payments", "warehouse", "carrier", "mailer")


@dataclass
class Tenant:
    slug: str
    api_key: str
    approvers: list[tuple[str, str]]  # (username, password): two, for refunds over $1,000
    orders: list[dict[str, Any]] = field(default_factory=list)  # with the order's part (sku)
    warehouses: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)  # the carrier accepts these
    bad_addresses: list[str] = field(default_factory=list)  # ... and refuses these


def tenant_slugs(count: int) -> list[str]:
    names = SEEDED + EXTRA
    return names[:count] + [f"tenant{n}" for n in range(len(names) + 1, count + 1)]


def extra_tenants(slugs: list[str]) -> list[str]:
    """The tenants the sandbox must seed beyond its own two."""
    return [slug for slug in slugs if slug not in SEEDED]


def create(slugs: list[str], approval_expiry: int) -> dict[str, dict[str, Any]]:
    """Tenants, two approvers, the agent's owner and API key, and a refund policy (the default
    rules) whose approvals expire after `approval_expiry` seconds. In the soak's database."""
    from approvals.models import Policy
    from approvals.policies import DEFAULTS
    from runs.models import User
    from runs.services import api_key_issue, tenant_create, user_create

    made: dict[str, dict[str, Any]] = {}
    for slug in slugs:
        tenant = tenant_create(slug=slug, name=slug.capitalize())
        approvers = []
        for number in (1, 2):
            username, password = f"{slug}-approver{number}", secrets.token_urlsafe(12)
            user_create(
                username=username, tenant=tenant, role=User.Role.APPROVER, password=password
            )
            approvers.append((username, password))
        owner = user_create(
            username=f"{slug}-owner",
            tenant=tenant,
            role=User.Role.VIEWER,
            password=secrets.token_urlsafe(12),
        )
        _, token = api_key_issue(tenant=tenant, name="soak agent", principal=owner, scopes=["*"])
        Policy.objects.create(
            tenant=tenant,
            capability_id="refund-order-v2",
            version=1,
            rules=DEFAULTS["refund-order-v2"]["rules"],
            expiry_seconds=approval_expiry,
            created_by="soak",
        )
        made[slug] = {"api_key": token, "approvers": approvers}
    return made


def connectors(slugs: list[str], sandbox_url: str) -> dict[str, Any]:
    from toolcalls.connectors import SANDBOX_TOKENS

    return {
        slug: {
            system: {"base_url": f"{sandbox_url}/{system}", "token": SANDBOX_TOKENS[system]}
            for system in SYSTEMS
        }
        for slug in slugs
    }


def write_connectors(path: Path, slugs: list[str], sandbox_url: str) -> None:
    path.write_text(json.dumps(connectors(slugs, sandbox_url)))
    path.chmod(0o600)


def read_sandbox(sandbox_url: str, made: dict[str, dict[str, Any]]) -> list[Tenant]:
    """What each tenant owns at the sandbox, read once from its /data."""
    data = httpx.get(f"{sandbox_url}/data", timeout=30).json()
    parts = {w["order_id"]: w["sku"] for w in data["warranties"]}
    tenants = []
    for slug, people in made.items():
        tenant = Tenant(slug, people["api_key"], people["approvers"])
        tenant.orders = [
            {**order, "sku": parts.get(order["id"], "PART-100")}
            for order in data["orders"]
            if order["tenant"] == slug
        ]
        tenant.warehouses = [w["id"] for w in data["warehouses"] if w["tenant"] == slug]
        for address in data["addresses"]:
            if address["tenant"] == slug:
                (tenant.addresses if address["valid"] else tenant.bad_addresses).append(
                    address["id"]
                )
        tenants.append(tenant)
    return tenants


def secrets_to_find(tenants: list[Tenant], slugs: list[str], sandbox_url: str) -> list[str]:
    """What must never be in a log: connector tokens, API keys, passwords."""
    found = {
        endpoint["token"]
        for systems in connectors(slugs, sandbox_url).values()
        for endpoint in systems.values()
    }
    for tenant in tenants:
        found.add(tenant.api_key)
        found.add(tenant.api_key.split(".", 1)[1])  # the secret half alone, too
        found.update(password for _, password in tenant.approvers)
    return sorted(found)
