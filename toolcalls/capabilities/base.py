"""Capability contracts: the machinery (DESIGN section 5). The concrete contracts are in
one module per external system beside this one (payments, warehouse, carrier, mailer).

A contract says what a tool call may contain (a JSON Schema, `additionalProperties: false`),
checks it against trusted data at the external system (never against what the agent claims),
and tells the dispatcher how to send it, look it up, verify it, retry it and undo it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import httpx
import jsonschema

from config import telemetry
from runs import scopes
from runs.schema_check import Check, compile_schema
from toolcalls import connectors, keepalive

Problems = list[dict[str, str]]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    base_delay: float
    max_delay: float


# Errors that prove nothing was executed; each capability may tune them.
DEFAULT_RETRY = {
    "tool.rate_limited": RetryPolicy(max_attempts=6, base_delay=0.5, max_delay=20),
    "tool.upstream_5xx": RetryPolicy(max_attempts=5, base_delay=0.5, max_delay=10),
    "tool.unreachable": RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=15),
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class OpenCall:
    """Another tool call of this tenant on the same object whose effect may not yet show at
    the external system (awaiting approval, in flight, unknown, or accepted and not yet seen
    there). A business check counts it against what the object still allows."""

    id: str
    args: dict[str, Any]
    execution_status: str
    external_request_id: str
    external_id: str


OpenCalls = Callable[[str, str], list[OpenCall]]


class TrustedData:
    """Reads at the external system with server-side credentials, for business checks and
    verification. A read that fails raises UpstreamUnavailable.

    `open_calls(capability_id, object_ref)` reads our own stored state: the tenant's other
    calls of that capability on that object that are not final (toolcalls/checks.py gives
    it; without it a check sees none)."""

    def __init__(
        self, tenant_slug: str, timeout: float = 5.0, open_calls: OpenCalls | None = None
    ) -> None:
        self.tenant_slug = tenant_slug
        self.timeout = timeout
        self._open_calls = open_calls

    def open_calls(self, capability_id: str, object_ref: str) -> list[OpenCall]:
        if self._open_calls is None:
            return []
        return self._open_calls(capability_id, object_ref)

    def get(self, system: str, path: str) -> dict[str, Any] | None:
        status, body = self._read(system, path)
        if status == 404:
            return None
        if status != 200:
            raise UpstreamUnavailable(f"{system} answered {status}")
        return body()

    def _read(self, system: str, path: str) -> tuple[int, Callable[[], Any]]:
        endpoint = connectors.endpoint_for(self.tenant_slug, system)
        if telemetry.enabled():
            # Traced, a read goes through httpx: its instrumentation gives the read its span
            # and the request its traceparent header, as for writes.
            try:
                response = connectors.request(endpoint, "GET", path, timeout=self.timeout)
            except httpx.HTTPError as exc:
                raise UpstreamUnavailable(f"{system} did not answer: {type(exc).__name__}") from exc
            return response.status_code, response.json
        headers = {"Authorization": f"Bearer {endpoint.token}"}
        try:
            answer = keepalive.get(endpoint.base_url + path, headers, timeout=self.timeout)
        except keepalive.ReadFailed as exc:
            raise UpstreamUnavailable(f"{system} did not answer: {exc}") from exc
        return answer.status, answer.json


class UpstreamUnavailable(Exception):
    pass


@dataclass(frozen=True)
class Fact:
    """One line of what the external system says about a call's object, for the person who
    decides it (the approval page's context panel). `cents_of` names the currency when the
    value is an amount in cents; `warn` marks a line that argues against the call."""

    label: str
    value: Any
    cents_of: str | None = None
    warn: bool = False


# (trusted data, the call's args) -> what the approver should know about its object. Reads
# with the tenant's credentials; raises UpstreamUnavailable when the system does not answer.
ContextReader = Callable[[TrustedData, dict[str, Any]], list[Fact]]


@dataclass(frozen=True)
class Capability:
    id: str
    version: int
    title: str
    system: str
    action: str
    kind: Literal["read", "write"]
    permission: str
    risk: Literal["low", "medium", "high"]
    reversible: bool
    input_schema: dict[str, Any]
    object_ref: Callable[[dict[str, Any]], str]
    # The arguments that say which object the call acts on: the ones `object_ref` reads. An
    # approver may not edit them (the object, its revision and the idempotency key were fixed
    # from them at proposal); `register` checks that `object_ref` reads no other.
    identity_fields: tuple[str, ...]
    build_request: Callable[[dict[str, Any]], Request]
    summary: Callable[[dict[str, Any]], str]
    business_check: Callable[[TrustedData, dict[str, Any]], Problems]
    # The field of the response that names the operation at the external system.
    external_id_field: str
    # GET path (query `request_id=`) that finds the operation by our external request id.
    lookup_path: str | None
    # How long a look-up may miss an operation that did happen ("not found" is no proof).
    consistency_window: float
    # (trusted data, the call's external id, its args) -> confirmed_success /
    # confirmed_failure / inconclusive
    verify: Callable[[TrustedData, str, dict[str, Any]], str] | None
    compensation: str | None = None
    compensation_args: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    # The remote keeps idempotency keys this long (seconds); None: it does not deduplicate.
    remote_dedupe_window: float | None = None
    timeout: float = 5.0
    retry: dict[str, RetryPolicy] = field(default_factory=lambda: dict(DEFAULT_RETRY))
    # Look-ups before an unknown outcome goes to a person.
    max_lookups: int = 6
    # A response status meaning the operation already finished (not just accepted).
    completes_on_response: bool = True
    # What an approver reads beside the arguments (toolcalls/context.py); None: the page
    # shows our own other calls on the object instead.
    context: ContextReader | None = None

    @property
    def irreversible(self) -> bool:
        return self.kind == "write" and not self.reversible and self.compensation is None

    @cached_property
    def validator(self) -> jsonschema.Draft202012Validator:
        # Built once per contract: building it cost a proposal more than validating with it.
        return jsonschema.Draft202012Validator(self.input_schema)

    @cached_property
    def quick_check(self) -> Check | None:
        # A quick "valid" before jsonschema's walk (runs/schema_check.py), built once too.
        return compile_schema(self.input_schema)

    def validate(self, args: Any) -> Problems:
        if self.quick_check is not None and self.quick_check(args):
            return []
        problems = []
        for error in sorted(self.validator.iter_errors(args), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in error.absolute_path)
            if error.validator == "additionalProperties":
                path = "args"
            problems.append(
                {
                    "field": f"args.{path}" if path and path != "args" else "args",
                    "problem": error.message,
                }
            )
        return problems

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "title": self.title,
            "system": self.system,
            "kind": self.kind,
            "permission": self.permission,
            "risk": self.risk,
            "reversible": self.reversible,
            "compensation": self.compensation,
            "irreversible": self.irreversible,
            "lookup": bool(self.lookup_path),
            "consistency_window_seconds": self.consistency_window,
            "remote_dedupe_window_seconds": self.remote_dedupe_window,
            "timeout_seconds": self.timeout,
            "retry": {
                name: {
                    "max_attempts": p.max_attempts,
                    "base_delay": p.base_delay,
                    "max_delay": p.max_delay,
                }
                for name, p in self.retry.items()
            },
            "input_schema": self.input_schema,
        }


REGISTRY: dict[str, Capability] = {}


def register(capability: Capability) -> Capability:
    jsonschema.Draft202012Validator.check_schema(capability.input_schema)
    _check_identity_fields(capability)
    REGISTRY[capability.id] = capability
    # API keys are scoped by capability id and permission (runs/scopes.py).
    scopes.register(capability.id, capability.permission)
    return capability


class _ReadRecorder(dict):
    """The schema's example, noting which keys `object_ref` reads."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def _check_identity_fields(capability: Capability) -> None:
    """Identity fields are required arguments, and `object_ref` reads nothing else: an edit of
    any other field leaves the call on the same object."""
    identity = set(capability.identity_fields)
    if not identity or not identity <= set(capability.input_schema.get("required", [])):
        raise ValueError(f"{capability.id}: identity_fields must name required arguments")
    for example in capability.input_schema.get("examples", []):
        recorder = _ReadRecorder(example)
        capability.object_ref(recorder)
        if not recorder.read <= identity:
            raise ValueError(
                f"{capability.id}: object_ref reads {sorted(recorder.read)}, "
                f"not only identity_fields {sorted(identity)}"
            )


def get(capability_id: str) -> Capability | None:
    return REGISTRY.get(capability_id)


# --- shared pieces --------------------------------------------------------------------------


def schema(properties: dict[str, Any], required: list[str], example: dict[str, Any]) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required,
        "properties": properties,
        "examples": [example],
    }


# Three digits for the seeded orders; up to seven for the fresh ones a benchmark adds
# (the sandbox's `POST /orders`), one per call.
ORDER_ID = {"type": "string", "title": "Order", "pattern": "^order-[0-9]{3,7}$"}


def problem(field_name: str, text: str) -> Problems:
    return [{"field": field_name, "problem": text}]


def owned(data: TrustedData, record: dict[str, Any] | None, what: str, field_name: str) -> Problems:
    # Another tenant's object is reported exactly like a missing one.
    if record is None or record.get("tenant") != data.tenant_slug:
        return problem(field_name, f"No {what} of this tenant has this id.")
    return []


def confirmed(ok: bool) -> str:
    return "confirmed_success" if ok else "confirmed_failure"
