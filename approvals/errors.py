"""The error names of approvals: stable, dotted, and what each means to the person who sees it.

Raised as `runs.errors.DomainError(NAME, message)`; the console shows the message and the API
answers the name."""

from __future__ import annotations

FORBIDDEN = "approval.forbidden"  # a viewer tried to decide
SELF_APPROVAL = "approval.self_approval"  # the person the agent acts for tried to approve
ALREADY_DECIDED = "approval.already_decided"  # the approval is no longer pending
ALREADY_APPROVED_BY_YOU = "approval.already_approved_by_you"  # quorum needs other people
EXPIRED = "approval.expired"  # past its deadline: it cannot be decided or consumed
STALE = "approval.stale"  # the page was rendered at another version of the approval
REASON_REQUIRED = "approval.reason_required"  # a rejection says why
INVALID_STATE = "approval.invalid_state"  # a transition its state does not allow
NOT_APPROVED = "approval.not_approved"  # dispatch found the call's approval not approved
EDIT_NOT_ALLOWED = "approval.edit_not_allowed"  # an edit of a field the contract fixes
CHECK_FAILED = "approval.check_failed"  # the call would fail its business check now
PREVIEW_STALE = "approval.preview_stale"  # a confirm step for an edit previewed on another version
# Policies edited in the console (approvals/policy_edits.py).
POLICY_FORBIDDEN = "policy.forbidden"  # only the tenant's admins publish policies
POLICY_INVALID = "policy.invalid"  # a rule, an expiry or an escalation it cannot take
POLICY_CONDITION_NOT_ALLOWED = "policy.condition_not_allowed"  # not a comparison of a field
POLICY_STALE = "policy.stale"  # another version was published since the form was opened
