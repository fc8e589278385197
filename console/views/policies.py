"""Policies in the console: the list (each rule as a sentence), one capability's versions
with a diff between any two, and for the tenant's admins the editor — a form per rule, the
expiry in hours and minutes — with "try this rule", which judges example arguments or a
recent call's by the draft through the same evaluator as `POST /api/v1/policy/evaluate`."""

from __future__ import annotations

import json
from functools import wraps
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.models import Policy
from approvals.policies import policy_default, policy_preview
from approvals.policy_edits import policy_draft, policy_publish
from console import policy_forms, policy_text
from runs.errors import DomainError
from runs.permissions import tenant_admin_required, tenant_member_required
from toolcalls import capabilities
from toolcalls.models import ToolCall
from toolcalls.propose import tool_call_evaluate_policy


def readers_only(view: Any) -> Any:
    """Approvers and admins read policies (they decide by them); viewers do not."""

    @tenant_member_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.can_decide:
            raise PermissionDenied("Approvers and admins read the policies.")
        return view(request, *args, **kwargs)

    return wrapper


def _known(capability_id: str) -> str:
    if capabilities.get(capability_id) is None:
        raise Http404("No such capability.")
    return capability_id


@require_GET
@readers_only
def policy_list(request: HttpRequest) -> HttpResponse:
    tenant = request.user.tenant
    # Only the newest version of each capability: one query however many versions there are.
    newest = Policy.objects.filter(
        tenant=OuterRef("tenant"), capability_id=OuterRef("capability_id")
    ).order_by("-version")
    latest = {
        policy.capability_id: policy
        for policy in Policy.objects.filter(
            tenant=tenant, version=Subquery(newest.values("version")[:1])
        )
    }
    writes = {c.id for c in capabilities.REGISTRY.values() if c.kind == "write"}
    rows = []
    for capability_id in sorted(writes | set(latest)):
        policy = latest.get(capability_id) or policy_default(tenant, capability_id)
        rows.append(
            {
                "capability": capabilities.get(capability_id),
                "capability_id": capability_id,
                "policy": policy,
                "stored": capability_id in latest,
                "lines": policy_text.policy_lines(policy),
            }
        )
    return render(request, "console/policies.html", {"rows": rows})


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@require_GET
@readers_only
def policy_detail(request: HttpRequest, capability_id: str) -> HttpResponse:
    tenant = request.user.tenant
    versions = list(
        Policy.objects.filter(tenant=tenant, capability_id=_known(capability_id)).order_by(
            "-version"
        )
    )
    if not versions:
        versions = [policy_preview(tenant, capability_id)]  # the defaults, not yet written
    by_number = {policy.version: policy for policy in versions}
    newer = by_number.get(_int(request.GET.get("to")) or 0, versions[0])
    older = by_number.get(
        _int(request.GET.get("from")) or 0, by_number.get(newer.version - 1, newer)
    )
    context = {
        "capability_id": capability_id,
        "capability": capabilities.get(capability_id),
        "versions": [(policy, policy_text.policy_lines(policy)) for policy in versions],
        "older": older,
        "newer": newer,
        "diff": policy_text.policy_diff(older, newer) if older is not newer else [],
    }
    return render(request, "console/policy_detail.html", context)


def _edit_page(
    request: HttpRequest, policy: Policy, forms: tuple[Any, Any], status: int = 200, **extra: Any
) -> HttpResponse:
    form, rules = forms
    context = {
        "capability_id": policy.capability_id,
        "capability": capabilities.get(policy.capability_id),
        "policy": policy,
        "form": form,
        "rules": rules,
        "recent_calls": policy_forms.recent_calls(
            tenant=request.user.tenant, capability_id=policy.capability_id
        ),
        "try_args": request.POST.get("try_args") or policy_forms.example_args(policy.capability_id),
        "try_call": request.POST.get("try_call", ""),
        **extra,
    }
    return render(request, "console/policy_edit.html", context, status=status)


@tenant_admin_required
def policy_edit(request: HttpRequest, capability_id: str) -> HttpResponse:
    tenant = request.user.tenant
    current = policy_preview(tenant, _known(capability_id))
    if request.method != "POST":
        return _edit_page(request, current, policy_forms.forms_for(current))
    if "add_rule" in request.POST:
        more = policy_forms.forms_with_another_rule(current, request.POST)
        return _edit_page(request, current, more)
    form, rules = policy_forms.forms_for(current, request.POST)
    if not (form.is_valid() and rules.is_valid()):
        return _edit_page(request, current, (form, rules), status=422)
    try:
        policy, published = policy_publish(
            tenant=tenant,
            capability_id=capability_id,
            draft=policy_forms.draft_of(form, rules),
            based_on=form.cleaned_data["based_on"],
            by=request.user,
        )
    except DomainError as exc:
        # The form as typed, the refusal above it; nothing was saved.
        return _edit_page(request, current, (form, rules), status=exc.status, refusal=exc)
    if not published:
        messages.info(request, f"Nothing changed: version {policy.version} stays in force.")
    else:
        messages.success(
            request,
            f"Published version {policy.version}. Calls proposed from now on are judged by it; "
            "approvals already open keep the version they were asked under.",
        )
    return redirect("policies:detail", capability_id)


def _try_args(request: HttpRequest) -> dict[str, Any]:
    """The arguments to try: a recent call's (of this tenant), or the example typed in."""
    call_id = request.POST.get("try_call", "").strip()
    if call_id:
        call = ToolCall.objects.filter(tenant=request.user.tenant, pk=call_id).first()
        if call is None:
            raise Http404("No such tool call.")
        return call.args
    try:
        args = json.loads(request.POST.get("try_args", ""))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"The example arguments are not JSON: {exc.msg} (line {exc.lineno})."
        ) from exc
    if not isinstance(args, dict):
        raise ValueError('The example arguments are a JSON object: {"field": value, …}.')
    return args


def _form_problems(form: Any, rules: Any) -> list[dict[str, str]]:
    """The form's errors as a list, for the try box (an htmx answer replaces only the box)."""
    found = [
        {"field": form.fields[name].label or name, "problem": " ".join(problems)}
        for name, problems in form.errors.items()
    ]
    for number, row in enumerate(rules.forms, start=1):
        for name, problems in row.errors.items():
            label = row.fields[name].label if name in row.fields else name
            found.append({"field": f"rule {number}, {label}", "problem": " ".join(problems)})
    return found


@require_POST
@tenant_admin_required
def policy_try(request: HttpRequest, capability_id: str) -> HttpResponse:
    """Judge the arguments by the draft on the form and by the version in force, saving
    nothing. The answers are those a proposal would get (tool_call_evaluate_policy)."""
    tenant = request.user.tenant
    current = policy_preview(tenant, _known(capability_id))
    form, rules = policy_forms.forms_for(current, request.POST)
    outcome: dict[str, Any] = {}
    try:
        args = _try_args(request)
        if not (form.is_valid() and rules.is_valid()):
            outcome["details"] = _form_problems(form, rules)
            raise ValueError("Fix the rules marked below first; then try again.")
        draft = policy_draft(
            tenant=tenant, capability_id=capability_id, draft=policy_forms.draft_of(form, rules)
        )
        outcome["draft"] = tool_call_evaluate_policy(
            tenant=tenant, capability_id=capability_id, args=args, policy=draft
        )
        outcome["now"] = tool_call_evaluate_policy(
            tenant=tenant, capability_id=capability_id, args=args
        )
        outcome["draft_expiry"] = policy_text.duration(draft.expiry_seconds)
        outcome["draft_lines"] = policy_text.policy_lines(draft)
    except (ValueError, DomainError) as exc:
        outcome["problem"] = exc.message if isinstance(exc, DomainError) else str(exc)
        if isinstance(exc, DomainError):
            outcome["details"] = exc.details
    if request.htmx:
        context = {"tried": outcome}
        return render(request, "console/policy_edit.html#try-result", context)
    return _edit_page(request, current, (form, rules), tried=outcome)
