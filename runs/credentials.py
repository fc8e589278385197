"""Run-scoped credentials: mint one for a run, read one from a bearer token, revoke them
when the run ends.

A credential (`rcr_…`) is what an agent hands to a worker that should act on one run and
nothing else: it carries the minting key's tenant and principal, scopes within the key's, an
expiry within the key's and at most RUN_CREDENTIAL_MAX_TTL_SECONDS away, and works only on
its run's endpoints (config/api.py checks the route). It stops at its expiry and at the run's
end (`revoke_for_run`, registered with runs.run_end).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs import errors, events, run_end, scopes
from runs.credential_models import RunCredential
from runs.errors import RUN_CLOSED, DomainError, not_found
from runs.models import ApiKey, Run
from runs.selectors import hash_secret


def credential_mint(
    *, api_key: ApiKey, run_id: str, ttl_s: int, scopes_asked: Sequence[str] | None, actor: str
) -> tuple[RunCredential, str]:
    """Mint a credential for the key's run `run_id`; return it with its token (shown once)."""
    if getattr(api_key, "run_credential", None) is not None:
        raise DomainError(
            errors.CREDENTIAL_MINTED_BY_CREDENTIAL,
            "A run-scoped credential cannot mint another; mint with the API key.",
            status=403,
        )
    asked = list(dict.fromkeys(api_key.scopes if scopes_asked is None else scopes_asked))
    _check_scopes(asked, api_key)
    expires_at = _expiry(api_key, ttl_s)
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(tenant=api_key.tenant, pk=run_id).first()
        if run is None:
            raise not_found("run", run_id)
        if not run.is_open:
            raise DomainError(RUN_CLOSED, f"Run {run.pk} is {run.state}; it takes no credentials.")
        credential = RunCredential.objects.create(
            tenant=api_key.tenant,
            run=run,
            api_key=api_key,
            scopes=asked,
            expires_at=expires_at,
            secret_hash=hash_secret(secret),
        )
        events.append(
            run=run,
            event_type="run.credential_minted",
            payload={
                "credential_id": credential.pk,
                "api_key_id": api_key.pk,
                "scopes": asked,
                "expires_at": expires_at.isoformat(),
            },
            producer="api",
            actor=actor,
        )
    return credential, f"{credential.pk}.{secret}"


def _check_scopes(asked: list[str], api_key: ApiKey) -> None:
    problems = [problem for scope in asked if (problem := scopes.scope_problem(scope))]
    if problems:
        raise DomainError(errors.API_KEY_INVALID_SCOPE, " ".join(problems), status=422)
    wider = [scope for scope in asked if not scopes.within(scope, api_key.scopes)]
    if wider:
        raise DomainError(
            errors.CREDENTIAL_SCOPE_TOO_WIDE,
            f"{', '.join(wider)} goes beyond the key's scopes ({', '.join(api_key.scopes)}); "
            "ask for the key's scopes or fewer.",
            status=403,
            details=[{"field": "scopes", "problem": f"wider than the key's: {s}"} for s in wider],
        )


def _expiry(api_key: ApiKey, ttl_s: int) -> datetime:
    cap = settings.RUN_CREDENTIAL_MAX_TTL_SECONDS
    if ttl_s > cap:
        raise DomainError(
            errors.CREDENTIAL_TTL_TOO_LONG,
            f"ttl_s is at most {cap} seconds (RUN_CREDENTIAL_MAX_TTL_SECONDS); mint a new "
            "credential when it runs out.",
            status=422,
        )
    expires_at = timezone.now() + timedelta(seconds=ttl_s)
    if api_key.expires_at is not None and expires_at > api_key.expires_at:
        raise DomainError(
            errors.CREDENTIAL_TTL_TOO_LONG,
            f"The key expires at {api_key.expires_at.isoformat()}, before this credential "
            "would; ask for a shorter ttl_s.",
            status=422,
        )
    return expires_at


def credential_authenticate(token: str) -> ApiKey | None:
    """The minting key, acting as the credential that `token` (`<rcr id>.<secret>`) names:
    its scopes narrowed to the credential's and `run_credential` set. None for a token that
    names no credential; a named 401 for one that expired or was revoked."""
    credential_id, _, secret = token.partition(".")
    if not credential_id.startswith("rcr_") or not secret or "\x00" in token:
        return None
    credential = (
        RunCredential.objects.select_related("run", "api_key__tenant", "api_key__principal")
        .filter(pk=credential_id)
        .first()
    )
    if credential is None or not hmac.compare_digest(credential.secret_hash, hash_secret(secret)):
        return None
    key = credential.api_key
    if credential.revoked_at is not None or not credential.run.is_open or not key.is_active:
        why = credential.revoked_reason or (
            f"run {credential.run_id} is {credential.run.state}"
            if not credential.run.is_open
            else f"its key {key.pk} is {key.state}"
        )
        raise DomainError(
            errors.AUTH_CREDENTIAL_REVOKED,
            f"Run credential {credential.pk} no longer works ({why}).",
            status=401,
        )
    if credential.is_expired:
        raise DomainError(
            errors.AUTH_CREDENTIAL_EXPIRED,
            f"Run credential {credential.pk} expired at {credential.expires_at.isoformat()}; "
            "mint a new one with the API key.",
            status=401,
        )
    # The key row is loaded for this request only and never saved: narrowing it here makes
    # every scope check downstream (check_scope, eval:read) see the credential's scopes.
    key.scopes = credential.scopes
    key.run_credential = credential
    return key


@run_end.register
def revoke_for_run(*, run: Run, actor: str, producer: str, reason: str) -> None:
    """The run ended: its live credentials stop working, as one recorded fact."""
    live = list(
        RunCredential.objects.filter(run=run, revoked_at__isnull=True)
        .order_by("id")
        .values_list("pk", flat=True)
    )
    if not live:
        return
    RunCredential.objects.filter(pk__in=live).update(
        revoked_at=timezone.now(), revoked_reason=reason[:200]
    )
    events.append(
        run=run,
        event_type="run.credentials_revoked",
        payload={"credential_ids": live, "reason": reason},
        producer=producer,
        actor=actor,
    )
