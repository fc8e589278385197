"""The mailer's contract: email the order's customer."""

from __future__ import annotations

from typing import Any

from toolcalls.capabilities.base import (
    ORDER_ID,
    Capability,
    Problems,
    Request,
    TrustedData,
    confirmed,
    owned,
    problem,
    register,
    schema,
)

# --- email ----------------------------------------------------------------------------------


def _check_email(data: TrustedData, args: dict[str, Any]) -> Problems:
    order = data.get("payments", f"/orders/{args['order_id']}")
    problems = owned(data, order, "order", "args.order_id")
    if problems:
        return problems
    # Agents may write only to the order's own customer, whatever a page or a prompt says.
    if args["to"].lower() != order["customer_email"].lower():
        return problem("args.to", "Emails go only to the order's customer address.")
    return []


def _verify_email(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    email = data.get("mailer", f"/emails/{external_id}")
    if email is None:
        return "inconclusive"
    return confirmed(email["status"] == "sent")


register(
    Capability(
        id="send-email-v1",
        version=1,
        title="Email a customer",
        system="mailer",
        action="email",
        kind="write",
        permission="customers.email",
        risk="medium",
        reversible=False,
        input_schema=schema(
            {
                "order_id": ORDER_ID,
                "to": {"type": "string", "title": "To", "format": "email", "maxLength": 200},
                "subject": {"type": "string", "title": "Subject", "minLength": 1, "maxLength": 200},
                "body": {"type": "string", "title": "Message", "minLength": 1, "maxLength": 10_000},
            },
            ["order_id", "to", "subject", "body"],
            {
                "order_id": "order-001",
                "to": "customer-001@example.com",
                "subject": "Your refund",
                "body": "We refunded your order.",
            },
        ),
        object_ref=lambda a: f"order:{a['order_id']}:customer-email",
        identity_fields=("order_id",),
        build_request=lambda a: Request(
            "POST", "/emails", {"to": a["to"], "subject": a["subject"], "body": a["body"]}
        ),
        summary=lambda a: f"Email {a['to']}: “{a['subject']}”.",
        business_check=_check_email,
        external_id_field="message_id",
        lookup_path="/emails/lookup",
        consistency_window=2.0,
        verify=_verify_email,
        remote_dedupe_window=24 * 3600,
    )
)
