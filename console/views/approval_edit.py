"""Approve with edits in two steps: "Preview changes" (POST, then a redirect) shows the edit
as a diff with what it changes in the policy's eyes; "Confirm and approve" sends exactly the
previewed edit to the approve-with-edits view, with a signed token naming the approval's
version, so a preview made stale by another person's decision is refused.

Also the approval page's context panel, loaded as a fragment after the page so that a slow
external system never holds the page itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core import signing
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors
from approvals.errors import PREVIEW_STALE
from approvals.models import Approval
from approvals.policies import policy_preview, requirement
from console import approval_page as page
from console import formatting
from runs.errors import DomainError
from runs.models import Tenant
from runs.permissions import tenant_member_required
from toolcalls import capabilities, context
from toolcalls.capabilities import Capability
from toolcalls.checks import arguments_check, edit_value, edits_check

SALT = "console.approval-edit-preview"
# A preview older than this is shown again rather than confirmed.
PREVIEW_MAX_AGE = 30 * 60
RISK_ORDER = {"low": 0, "medium": 1, "high": 2}


def _get(request: HttpRequest, approval_id: str) -> Approval:
    try:
        return selectors.approval_get(tenant=request.user.tenant, approval_id=approval_id)
    except DomainError as exc:
        raise Http404(exc.message) from exc


@dataclass(frozen=True)
class Preview:
    """An edit as it was previewed: on which version of the approval, with which values."""

    approval_id: str
    version: int
    summary_hash: str
    edits: dict[str, Any]
    reason: str

    def token(self) -> str:
        return signing.dumps(
            [self.approval_id, self.version, self.summary_hash, self.edits, self.reason], salt=SALT
        )

    @classmethod
    def load(cls, token: str) -> Preview:
        approval_id, version, summary_hash, edits, reason = signing.loads(
            token, salt=SALT, max_age=PREVIEW_MAX_AGE
        )
        return cls(approval_id, version, summary_hash, edits, reason)

    def command(self) -> dict[str, Any]:
        """What the approve-with-edits service takes from the preview."""
        return {
            "seen_version": self.version,
            "seen_summary_hash": self.summary_hash,
            "edits": self.edits,
        }


def preview_from_post(request: HttpRequest, approval: Approval) -> Preview | None:
    """The previewed edit a confirm form sent; None for the one-step form (the API's and the
    tests' contract: `edit__<name>` fields). A token for another approval, altered or too old
    is refused."""
    token = request.POST.get("preview")
    if not token:
        return None
    try:
        preview = Preview.load(token)
    except (signing.BadSignature, ValueError) as exc:
        raise DomainError(
            PREVIEW_STALE, "This preview is too old or was altered; preview the edit again."
        ) from exc
    if preview.approval_id != approval.pk:
        raise DomainError(PREVIEW_STALE, "This preview belongs to another approval.")
    return preview


# --- step 1: preview --------------------------------------------------------------------------


def _parse(
    approval: Approval, capability: Capability, post: Any
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The edited values from the typed form: (edits, what was typed, problems by field)."""
    money = formatting.money_fields(capability)
    required = set(capability.input_schema.get("required", []))
    edits, typed, problems = {}, {}, {}
    for name, spec in capability.input_schema["properties"].items():
        raw = post.get(f"arg__{name}")
        if raw is None or name in capability.identity_fields:
            continue
        typed[name] = raw
        if raw.strip() == "":
            if name in required:
                problems[name] = "Required."
            elif approval.args.get(name) not in (None, ""):
                edits[name] = ""
            continue
        try:
            if name in money:
                value = formatting.major_units_to_cents(raw, approval.args.get(money[name]))
            else:
                value = edit_value(spec, raw.strip() if spec.get("type") == "integer" else raw)
        except ValueError as exc:
            problems[name] = f"Type {exc}."
            continue
        if value != approval.args.get(name):
            edits[name] = value
    return edits, typed, problems


def _check(request: HttpRequest, approval: Approval, capability: Capability, edits: dict) -> dict:
    """The checks the confirm step will meet (the service runs them again): problems by
    field, "" for the form as a whole."""
    try:
        edits_check(capability, approval.args, edits)
        arguments_check(
            request.user.tenant,
            capability,
            {**approval.args, **edits},
            exclude=approval.tool_call_id,
        )
    except DomainError as exc:
        found = {d["field"].removeprefix("args."): d["problem"] for d in exc.details or []}
        return found or {"": exc.message}
    return {}


@require_POST
@tenant_member_required
def preview_edits(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)
    capability = capabilities.get(approval.tool_call.capability_id)
    if capability is None or not approval.can_be_decided_by(request.user, timezone.now()):
        messages.error(request, "No decision can be made on this approval now.")
        return redirect("approvals:detail", approval.pk)
    edits, typed, problems = _parse(approval, capability, request.POST)
    if not problems and not edits:
        problems[""] = "Nothing changed: change a value, or approve it as it stands."
    if not problems:
        problems = _check(request, approval, capability, edits)
    reason = request.POST.get("reason", "").strip()
    if problems:
        # Shown next to their fields on the page, after this redirect: a refresh re-posts nothing.
        request.session[f"edit-form:{approval.pk}"] = {
            "typed": typed,
            "problems": problems,
            "reason": reason,
        }
        return redirect(reverse("approvals:detail", args=[approval.pk]) + "#edit")
    preview = Preview(approval.pk, approval.version, approval.summary_hash, edits, reason)
    return redirect(
        reverse("approvals:confirm-edits", args=[approval.pk]) + f"?t={preview.token()}"
    )


# --- step 2: confirm --------------------------------------------------------------------------


def policy_warnings(
    tenant: Tenant, approval: Approval, capability: Capability, new_args: dict
) -> list[str]:
    """What the edit changes in the policy's eyes: the rule, the number of approvers, the
    risk (the current policy judges the edited arguments, as the service will)."""
    needed = requirement(
        policy_preview(tenant, approval.tool_call.capability_id),
        new_args,
        capability.risk,
    )
    warnings = []
    if needed.approvers == 0:
        warnings.append(
            "After the edit no rule asks for a person: confirming sends the call on its way."
        )
    elif needed.approvers > approval.required_approvers:
        warnings.append(
            f"The edit needs more approvers: rule “{needed.rule_name}” asks for "
            f"{needed.approvers} (now {approval.required_approvers}). Your approval counts "
            "as one; another person must approve it too."
        )
    elif needed.rule_name != approval.rule_name:
        warnings.append(f"Rule “{needed.rule_name}” applies instead of “{approval.rule_name}”.")
    if RISK_ORDER.get(needed.risk, 0) > RISK_ORDER.get(approval.risk, 0):
        warnings.append(f"The edit raises the risk from {approval.risk} to {needed.risk}.")
    return warnings


def amount_warnings(capability: Capability, before: dict, after: dict) -> list[str]:
    warnings = []
    for name, currency in formatting.money_fields(capability).items():
        old, new = before.get(name), after.get(name)
        if isinstance(old, int) and isinstance(new, int) and new > old:
            warnings.append(
                f"The edit raises the {formatting.label(capability, name).lower()} from "
                f"{formatting.money(old, before.get(currency))} to "
                f"{formatting.money(new, after.get(currency))}."
            )
    return warnings


@require_GET
@tenant_member_required
def confirm_edits(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)
    capability = capabilities.get(approval.tool_call.capability_id)
    try:
        preview = Preview.load(request.GET.get("t", ""))
    except (signing.BadSignature, ValueError):
        messages.error(request, "This preview is too old or was altered; preview the edit again.")
        return redirect("approvals:detail", approval.pk)
    if preview.approval_id != approval.pk or capability is None:
        raise Http404("No such preview.")
    new_args = {**approval.args, **preview.edits}
    diff = {
        name: {"from": approval.args.get(name), "to": value}
        for name, value in preview.edits.items()
    }
    stale = preview.version != approval.version or not approval.can_be_decided_by(
        request.user, timezone.now()
    )
    context = {
        "approval": approval,
        "preview": preview,
        "token": request.GET["t"],
        "changes": formatting.diff_rows(capability, diff, approval.args, new_args),
        "warnings": amount_warnings(capability, approval.args, new_args)
        + policy_warnings(request.user.tenant, approval, capability, new_args),
        "current_summary": formatting.summary_text(capability, approval.args, approval.summary),
        "summary": formatting.summary_text(capability, new_args, capability.summary(new_args)),
        "stale": stale,
    }
    return render(request, "approvals/confirm_edit.html", context)


# --- the context panel ------------------------------------------------------------------------


@require_GET
@tenant_member_required
def object_context(request: HttpRequest, approval_id: str) -> HttpResponse:
    """The object as the external system has it now (and our other calls on it): a fragment
    the approval page loads after itself."""
    approval = _get(request, approval_id)
    call = approval.tool_call
    now = timezone.now()
    read = context.object_context(tenant=request.user.tenant, call=call)
    nearby = []
    if not read.has_reader:
        nearby = context.calls_on_object(
            tenant=request.user.tenant, call=call, same_capability=False, now=now
        )
    return render(
        request,
        "approvals/context_panel.html",
        {
            "approval": approval,
            "read": read,
            "system_name": context.system_name(read.system),
            "nearby": [{"call": other, "summary": page.call_summary(other)} for other in nearby],
            "now": now,
        },
    )
