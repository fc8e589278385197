"""The agent API fuzzed from its own OpenAPI document (schemathesis), in process through WSGI.

Every operation of /api/v1/openapi.json gets generated requests — valid ones, and invalid ones
(wrong types, missing or unknown fields, NUL characters, huge numbers, wrong media types) —
sent with a real API key of a test tenant, with the sandbox running so that a proposal which
passes its schema meets the real business checks. The test fails on any 5xx and on any answer
the document does not describe: an undocumented status, a body that does not match its
schema, a wrong content type, invalid data accepted.

Random ids would only ever find 404s, so part of the generated requests name real objects:
runs (active, another tenant's), tool calls (authorized, awaiting approval, sent and
confirmed, failed), decisions; and part of the proposals are built from the capabilities'
own examples with fuzzed values (amounts around the policy's thresholds, known and unknown
orders, warehouses, SKUs), so they go through the gate, the business check and idempotency.

Bounded for CI: FUZZ_EXAMPLES (default 25) generated requests per operation, and a fixed seed
(FUZZ_SEED, default 1) so CI finds the same cases every time. For a longer local run:
`FUZZ_EXAMPLES=500 FUZZ_SEED=$RANDOM pytest tests/test_api_fuzz.py`.

Answers the document cannot state are allowed as such: 422 for a request that matches the
schema but breaks a rule the schema cannot say (a deadline in the past, arguments the
capability's own schema refuses, a business check, a string PostgreSQL cannot store).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode

from config.wsgi import application
from runs import services as run_services
from runs.models import Run, Tenant
from tests.helpers import BIG_REFUND, REFUND, WAYBILL, ApiClient, propose_in
from toolcalls import capabilities, dispatch
from toolcalls.models import ToolCall

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
SEED = int(os.environ.get("FUZZ_SEED", "1"))


# Schemathesis builds part of its requests before any fixture runs, so they carry this stand-in,
# which the app below replaces with the test agent's real key (set by the `real_ids` fixture).
KEY_PLACEHOLDER = "agent-key-of-this-test"
API_KEY: dict[str, str] = {}


def in_test_transaction(environ: dict, start_response: Any) -> Iterable[bytes]:
    """The WSGI app, as Django's test client calls it: without closing the database connection
    at the end of each request, which would end the test's transaction (pytest-django `db`)."""
    if environ.get("HTTP_AUTHORIZATION") == f"Bearer {KEY_PLACEHOLDER}":
        environ["HTTP_AUTHORIZATION"] = f"Bearer {API_KEY['token']}"
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        response = application(environ, start_response)
        body = list(response)
        response.close()
        return body
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


# Values known to break services like this one, mixed into one generated value in ten (a
# fuzzing dictionary): NUL, which PostgreSQL cannot store (lone surrogates cannot go through
# schemathesis's configuration; tests/test_hostile_input.py sends them); integers and floats
# past what canonical JSON carries; times at the edges of the calendar and of the offsets.
HOSTILE = {
    "string": [
        "\x00",
        "a\x00b",
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00+23:59",
        "key_\x00.x",
        "",
    ],
    "integer": [2**53, -(2**53), 2**63, 2**64, -1, 0],
    "number": [1e300, -1e300, 5e-324, 2.0**53],
}

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": SEED,
        "dictionaries": {f"hostile-{kind}": {"values": v} for kind, v in HOSTILE.items()},
        "generation": {
            "dictionaries": {
                kind: {"dictionary": f"hostile-{kind}", "probability": 0.1} for kind in HOSTILE
            }
        },
        "checks": {
            # Schema-valid requests may still break rules a JSON Schema cannot state (see above).
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
            },
        },
    }
)
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", in_test_transaction, config=CONFIG)

# Real ids of the current test, by kind: set by the `real_ids` fixture.
REAL_IDS: dict[str, list[str]] = {}


@schema.auth(refresh_interval=None)
class AgentKey:
    """The test agent's key, given as the document says (bearer). Given through schemathesis,
    not added to each call, so that it knows which requests were meant to lack it."""

    def get(self, case: Any, context: Any) -> str:
        return KEY_PLACEHOLDER

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


# Values the seeded sandbox knows, and some it does not, for the capabilities' arguments.
KNOWN_VALUES: dict[str, list[Any]] = {
    "order_id": [f"order-{n:03d}" for n in (1, 2, 3, 7, 10, 16)] + ["order-999"],
    "address_id": ["addr-001", "addr-002", "addr-bad-001", "addr-999"],
    "warehouse_id": ["wh-acme-1", "wh-acme-2", "wh-globex-1", "wh-none"],
    "sku": ["PART-100", "PART-200", "PART-300", "PART-999"],
    "waybill_id": ["wb_seed0001", "wb_none"],
    "reservation_id": ["rsv_seed0001", "rsv_none"],
    "currency": ["USD", "EUR"],
    "to": ["customer-001@example.com", "customer-002@example.com", "someone@else.example"],
}
# Around the default policy's thresholds ($200: one approver, $1,000: two) and the orders'
# refundable amounts.
AMOUNTS = [0, 1, 2500, 19_999, 20_000, 20_001, 35_000, 99_999, 100_000, 100_001, 150_000]


def _argument_value(name: str, example: Any) -> st.SearchStrategy[Any]:
    if isinstance(example, bool):
        return st.booleans()
    if isinstance(example, int):
        return st.one_of(st.sampled_from(AMOUNTS), st.integers(-3, 300_000))
    if name in KNOWN_VALUES:
        return st.sampled_from(KNOWN_VALUES[name])
    return st.one_of(st.just(example), st.text(max_size=30))


@st.composite
def capability_args(draw: st.DrawFn, capability: capabilities.Capability) -> dict[str, Any]:
    """The capability's example with some values fuzzed, a field dropped or one added."""
    example = capability.input_schema["examples"][0]
    args = {
        name: draw(st.one_of(st.just(value), _argument_value(name, value)))
        for name, value in example.items()
    }
    if args and draw(st.integers(0, 9)) == 0:
        args.pop(draw(st.sampled_from(sorted(args))))
    if draw(st.integers(0, 9)) == 0:
        args["unexpected"] = 1
    return args


@st.composite
def proposals(draw: st.DrawFn) -> dict[str, Any]:
    capability = draw(st.sampled_from(sorted(capabilities.REGISTRY)))
    body: dict[str, Any] = {
        "capability": capability,
        "args": draw(capability_args(capabilities.REGISTRY[capability])),
        # A few intents, so the same intent comes back with the same or other arguments.
        "intent": draw(st.sampled_from(["fuzz-1", "fuzz-2", "fuzz-3"])),
    }
    if draw(st.booleans()):
        body["object"] = {"ref": draw(st.sampled_from(["", "order-001", "order-002"]))}
        body["object"]["revision"] = draw(st.one_of(st.none(), st.integers(0, 3)))
    if draw(st.booleans()):
        body["depends_on"] = draw(st.lists(st.sampled_from(REAL_IDS["tool_call_id"]), max_size=2))
    if draw(st.booleans()):
        body["decision_id"] = draw(st.sampled_from(REAL_IDS["decision_id"]))
    return body


def _is_positive(case: Any, location: ParameterLocation) -> bool:
    component = case.meta.components.get(location) if case.meta else None
    return component is None or component.mode == GenerationMode.POSITIVE


# Four times in five.
OFTEN = st.integers(0, 4).map(bool)


@schema.hook
def flatmap_case(context: Any, case: Any) -> st.SearchStrategy[Any]:
    """Part of the requests name real objects; part of the proposals are real-looking. Only
    where the generated value was meant to be valid, so a negative case stays negative."""
    if not REAL_IDS:
        return st.just(case)
    return st.tuples(
        st.fixed_dictionaries(
            {
                name: st.sampled_from(REAL_IDS[name])
                for name in case.path_parameters
                if name in REAL_IDS  # others (a checkpoint's name) keep their generated value
            }
        ),
        OFTEN,
        proposals(),
        OFTEN,
    ).map(lambda drawn: _with_real_values(case, *drawn))


def _with_real_values(
    case: Any, ids: dict[str, str], use_ids: bool, proposal: dict, use_proposal: bool
) -> Any:
    if use_ids and _is_positive(case, ParameterLocation.PATH):
        case.path_parameters = {**case.path_parameters, **ids}
    if (
        use_proposal
        and case.path.endswith("/tool-calls")
        and case.method.upper() == "POST"
        and case.meta
        and case.meta.generation.mode == GenerationMode.POSITIVE
    ):
        case.body = proposal
    # Long-polling holds the request up to `wait` seconds; the fuzz test does not wait.
    # (A valid value stays valid, an invalid one is left as it is.)
    wait = (case.query or {}).get("wait")
    if isinstance(wait, int | float) and 0 <= wait <= 30:
        case.query["wait"] = min(wait, 0.2)
    return case


@pytest.fixture
def real_ids(
    agent: ApiClient, run: Run, other_tenant: Tenant, sandbox: Any
) -> Iterable[dict[str, list[str]]]:
    propose_in(run, REFUND, intent="fuzz-small")  # authorized
    propose_in(run, BIG_REFUND, intent="fuzz-big")  # awaiting approval
    sent = propose_in(run, WAYBILL, capability="create-waybill-v1", intent="fuzz-waybill")
    dispatch.tool_call_dispatch(tool_call_id=sent.pk)
    # The carrier refuses this address: the call fails.
    refused = {**WAYBILL, "address_id": "addr-bad-001"}
    failed = propose_in(run, refused, capability="create-waybill-v1", intent="fuzz-refused")
    dispatch.tool_call_dispatch(tool_call_id=failed.pk)
    decision = run_services.decision_record(
        tenant=run.tenant, run_id=run.pk, kind="refund_eligibility", content={}, actor="test"
    )
    other_run, _ = run_services.run_start(tenant=other_tenant, title="other", actor="test")
    API_KEY["token"] = agent.token
    REAL_IDS.update(
        run_id=[run.pk, run.pk, run.pk, other_run.pk],  # another tenant's: a 404
        tool_call_id=[c.pk for c in ToolCall.objects.filter(run=run)],
        decision_id=[decision.pk],
        name=["plan"],
    )
    agent.put(
        f"/api/v1/runs/{run.pk}/checkpoints/plan",
        {"state": "refunding", "step_index": 1, "schema_version": 1},
    )
    yield REAL_IDS
    REAL_IDS.clear()
    API_KEY.clear()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # Function-scoped fixtures are shared by the examples on purpose (one transaction, real ids).
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_as_its_document_says(case: Any, agent: ApiClient, real_ids: Any) -> None:
    case.call_and_validate()
