"""Where a run-scoped credential may act: its own run's endpoints and its run's tool calls,
plus the two tenant-wide reads that change nothing (the capability list and the policy dry
run). Everything else — another run, another run's call, starting a run, the eval traces —
is 403 `auth.credential_run_bound`, before the endpoint runs.

It lives here, not in runs, because a tool call's run is known only to this layer; the API's
authentication (config/api.py) calls it once the credential itself checked out.
"""

from __future__ import annotations

from django.http import HttpRequest

from runs.credential_models import RunCredential
from runs.errors import AUTH_CREDENTIAL_RUN_BOUND, DomainError
from toolcalls.models import ToolCall

# (method, the end of the route): reads of the tenant's contracts, bound to no run.
RUNLESS_ROUTES = {("GET", "/capabilities"), ("POST", "/policy/evaluate")}


def credential_check_route(credential: RunCredential, request: HttpRequest) -> None:
    match = request.resolver_match
    kwargs = match.kwargs if match else {}
    if "run_id" in kwargs:
        if kwargs["run_id"] != credential.run_id:
            _refuse(credential, f"run {kwargs['run_id']}")
        return
    if "tool_call_id" in kwargs:
        run_of_call = (
            ToolCall.objects.filter(tenant_id=credential.tenant_id, pk=kwargs["tool_call_id"])
            .values_list("run_id", flat=True)
            .first()
        )
        # A call that does not exist is the endpoint's 404, as for a key.
        if run_of_call is not None and run_of_call != credential.run_id:
            _refuse(credential, f"tool call {kwargs['tool_call_id']} of run {run_of_call}")
        return
    route = match.route.rstrip("/") if match else ""
    if any(request.method == m and route.endswith(end) for m, end in RUNLESS_ROUTES):
        return
    _refuse(credential, f"{request.method} {request.path}")


def _refuse(credential: RunCredential, what: str) -> None:
    raise DomainError(
        AUTH_CREDENTIAL_RUN_BOUND,
        f"Run credential {credential.pk} acts on run {credential.run_id} only, not on {what}; "
        "use the API key for anything else.",
        status=403,
    )
