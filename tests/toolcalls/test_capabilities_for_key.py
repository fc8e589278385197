"""`GET /api/v1/capabilities` says which capabilities the asking key may propose
(`may_propose`), so an agent's tooling (the MCP server) offers only those."""

from __future__ import annotations

from runs.models import Tenant, User
from runs.services import api_key_issue
from tests.helpers import ApiClient


def listed_for(tenant: Tenant, owner: User, *scopes: str) -> dict[str, bool]:
    token = api_key_issue(tenant=tenant, name="scoped", principal=owner, scopes=scopes)[1]
    answer = ApiClient(token).get("/api/v1/capabilities").json()
    return {capability["id"]: capability["may_propose"] for capability in answer}


def test_it_marks_the_capabilities_the_keys_scopes_cover(tenant: Tenant, owner: User) -> None:
    listed = listed_for(tenant, owner, "payments.*")
    assert listed["refund-order-v2"] is True
    assert listed["get-order-v1"] is False  # its permission is orders.read
    assert listed["reserve-stock-v1"] is False
    assert listed["send-email-v1"] is False


def test_a_key_scoped_to_one_capability_may_propose_only_it(tenant: Tenant, owner: User) -> None:
    listed = listed_for(tenant, owner, "refund-order-v2")
    assert [cid for cid, allowed in listed.items() if allowed] == ["refund-order-v2"]


def test_a_wildcard_key_may_propose_everything(agent: ApiClient) -> None:
    answer = agent.get("/api/v1/capabilities").json()
    assert answer and all(capability["may_propose"] for capability in answer)


def test_the_openapi_document_names_the_field(agent: ApiClient) -> None:
    schemas = agent.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "may_propose" in schemas["CapabilityOut"]["required"]
