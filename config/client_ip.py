"""The client's address as django-axes sees it (AXES_CLIENT_IP_CALLABLE), read through the
number of proxies this deployment trusts (TRUSTED_PROXY_COUNT)."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """With N trusted proxies, each appends the address it received from to X-Forwarded-For,
    so the client is the N-th entry from the right; what is left of it the client wrote
    itself and is not trusted. With none (the default) the header is ignored. A header with
    fewer entries than proxies did not come through them: the peer's address is used."""
    peer = request.META.get("REMOTE_ADDR")
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies <= 0:
        return peer
    forwarded = [entry.strip() for entry in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    forwarded = [entry for entry in forwarded if entry]
    if len(forwarded) < proxies:
        return peer
    candidate = forwarded[-proxies]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        # A proxy we trust wrote something that is not an address: a misconfiguration, not
        # a client to tell apart. Lock on the peer rather than on a string anyone can vary.
        return peer
