"""Email backends for the notification tests: Django's in-memory backend (`mail.outbox`)
with a mail server that misbehaves on cue."""

from __future__ import annotations

import smtplib
from collections.abc import Callable, Sequence

from django.core.mail import EmailMessage
from django.core.mail.backends.locmem import EmailBackend


class FailsOnce(EmailBackend):
    """The mail server hangs up on the next `failures_left` sends, then takes them."""

    failures_left = 0

    def send_messages(self, messages: Sequence[EmailMessage]) -> int:
        if FailsOnce.failures_left > 0:
            FailsOnce.failures_left -= 1
            raise smtplib.SMTPServerDisconnected("the mail server hung up")
        return super().send_messages(messages)


class WhileSending(EmailBackend):
    """Runs `during` (once) while the first message is being sent: another worker that got
    the same outbox message at that moment."""

    during: Callable[[], None] | None = None

    def send_messages(self, messages: Sequence[EmailMessage]) -> int:
        during, WhileSending.during = WhileSending.during, None
        if during is not None:
            during()
        return super().send_messages(messages)
