"""`manage.py screenshots --out docs/screenshots`: the approval page, a run page and the
unknowns desk at 1280x800 and 390x844, as PNGs for the README.

Runs on the embedded default in a var directory of its own (bin/screenshots makes a fresh
one): migrates, seeds tenant `acme` and its people, starts the sandbox and the console on
free ports, and has an agent act through the API as the demo's does — a read of the order,
the same refund asked twice, an approver's edit raising one to $1,200, a refund whose answer
is lost — with dispatch run in this process, so what the pages show does not depend on
timing. Then Playwright drives /usr/bin/chromium through the pages.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application

from approvals.models import Approval
from console.management.commands.demo import Command as Demo
from runs.models import Tenant, User
from toolcalls import dispatch, gate
from toolcalls.models import ToolCall

WIDTHS = {"wide": (1280, 800), "phone": (390, 844)}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class Command(BaseCommand):
    help = (
        "Seed demo-like data through the real services, start the sandbox and the console, and "
        "save the approval page, a run page and the unknowns desk at 1280x800 and 390x844."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default="docs/screenshots", help="folder of the PNGs")
        parser.add_argument(
            "--chromium", default=os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
        )

    def handle(self, *args: object, **options: Any) -> None:
        if settings.EMBEDDED:
            call_command("migrate", verbosity=0)
        if not settings.EMBEDDED or Tenant.objects.filter(slug="acme").exists():
            raise CommandError(
                "screenshots seeds its own data: run it with bin/screenshots, which gives it a "
                "fresh embedded database."
            )
        demo = Demo(stdout=self.stdout, stderr=self.stderr)
        tenant, passwords = demo.seed()
        sandbox_port = free_port()
        sandbox = demo.start_sandbox(sandbox_port)
        settings.SANDBOX_URL = f"http://127.0.0.1:{sandbox_port}"
        server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
        server.set_app(get_wsgi_application())
        base_url = f"http://127.0.0.1:{server.server_address[1]}"
        settings.COUNTERSIGN_BASE_URL = base_url
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            pages = self.seed_calls(tenant, base_url, demo.fresh_api_key(tenant))
            self.shoot(base_url, passwords, pages, Path(options["out"]), options["chromium"])
        finally:
            server.shutdown()
            sandbox.terminate()
            sandbox.wait(timeout=10)

    # long: one scenario told in order, as the agent and the approver act it out
    def seed_calls(self, tenant: Tenant, base_url: str, token: str) -> dict[str, str]:
        api = httpx.Client(
            base_url=f"{base_url}/api/v1", headers={"Authorization": f"Bearer {token}"}
        )

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = api.post(path, json=body, timeout=15)
            if response.status_code >= 300:
                raise CommandError(f"{path}: {response.status_code} {response.text}")
            return response.json()

        def propose(run_id: str, capability: str, args: dict, intent: str, **more: Any) -> str:
            body = {"capability": capability, "args": args, "intent": intent, **more}
            return post(f"/runs/{run_id}/tool-calls", body)["tool_call_id"]

        def send(call_id: str) -> None:
            # Dispatch here rather than in a worker: the pages then show the same every time.
            dispatch.tool_call_dispatch(tool_call_id=call_id, worker="screenshots")

        run_id = post("/runs", {"title": "Refund order-003: charged twice"})["run_id"]
        read = propose(run_id, "get-order-v1", {"order_id": "order-003"}, "read-order")
        send(read)
        decision = post(
            f"/runs/{run_id}/decisions",
            {
                "kind": "refund-eligibility",
                "content": {
                    "eligible": True,
                    "order_id": "order-003",
                    "why": "the card was charged twice for one shipment",
                    "amount_cents": 25000,
                    "evidence": ["payments: two captures on 2026-11-28", "customer e-mail"],
                },
            },
        )["decision_id"]
        refund = {"order_id": "order-003", "amount_cents": 25000, "currency": "USD"}
        refund["reason"] = "charged twice"
        first = propose(run_id, "refund-order-v2", refund, "refund-1", decision_id=decision)
        second = propose(run_id, "refund-order-v2", refund, "refund-2", decision_id=decision)
        alice = User.objects.get(username="alice")
        approval = Approval.objects.get(tool_call_id=first)
        # Alice raises the first refund to the whole second charge: now two approvers.
        edited = gate.tool_call_approve_with_edits(
            tenant=tenant,
            approval_id=approval.pk,
            user=alice,
            seen_version=approval.version,
            seen_summary_hash=approval.summary_hash,
            edits={"amount_cents": 120000},
            reason="the second charge was the whole order",
        )

        lost_run = post("/runs", {"title": "Refund order-005: damaged part"})["run_id"]
        httpx.post(
            f"{settings.SANDBOX_URL}/faults",
            json={"system": "payments", "drop_response_after_commit": 1.0, "times": 1},
            timeout=5,
        ).raise_for_status()
        small = {"order_id": "order-005", "amount_cents": 4500, "currency": "USD"}
        lost = propose(lost_run, "refund-order-v2", small, "refund-damaged")
        send(lost)
        # The carrier lost an answer too, and its look-up lags: two systems on the desk.
        httpx.post(
            f"{settings.SANDBOX_URL}/faults",
            json={
                "system": "carrier",
                "drop_response_after_commit": 1.0,
                "times": 1,
                "lookup_lag_seconds": 3600,
            },
            timeout=5,
        ).raise_for_status()
        waybill = {"order_id": "order-005", "address_id": "addr-005"}
        shipped = propose(lost_run, "create-waybill-v1", waybill, "ship-replacement")
        send(shipped)
        for call_id in (lost, shipped):
            if ToolCall.objects.get(pk=call_id).execution_status != "result_unknown":
                raise CommandError(f"the lost answer did not leave {call_id} result_unknown")
        return {
            "approval": f"/approvals/{edited.pk}/",
            "run": f"/runs/{run_id}/",
            "desk": "/desk/",
            "confirm-edit": f"/approvals/{Approval.objects.get(tool_call_id=second).pk}/",
        }

    def shoot(
        self,
        base_url: str,
        passwords: dict[str, str],
        pages: dict[str, str],
        out: Path,
        chromium: str,
    ) -> None:
        from playwright.sync_api import sync_playwright

        # Playwright's sync API runs an event loop in this thread; the ORM is done by now.
        os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        out.mkdir(parents=True, exist_ok=True)
        # bob decides the approval alice edited; olivia (admin) reads the run and the desk;
        # alice previews an edit of the other refund.
        who = {"approval": "bob", "run": "olivia", "desk": "olivia", "confirm-edit": "alice"}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, headless=True, args=CHROMIUM_ARGS
            )
            for width_name, (width, height) in WIDTHS.items():
                for page_name, path in pages.items():
                    context = browser.new_context(
                        viewport={"width": width, "height": height},
                        timezone_id="America/New_York",
                        is_mobile=width_name == "phone",
                    )
                    page = context.new_page()
                    page.set_default_timeout(15_000)
                    page.goto(f"{base_url}/login/")
                    page.get_by_label("Username").fill(who[page_name])
                    page.get_by_label("Password").fill(passwords[who[page_name]])
                    page.get_by_role("button", name="Log in").click()
                    page.wait_for_url(lambda url: "/login/" not in url)
                    page.goto(f"{base_url}{path}")
                    if page_name == "approval":
                        page.locator("#context-facts").wait_for()
                    if page_name == "confirm-edit":
                        preview_an_edit(page)
                    file = out / f"{page_name}-{width_name}.png"
                    page.screenshot(path=str(file), full_page=True)
                    self.stdout.write(f"wrote {file}")
                    context.close()
            browser.close()


def preview_an_edit(page: Any) -> None:
    page.get_by_text("Approve with edits").first.click()
    page.get_by_label("Amount (USD)").fill("300")
    page.get_by_label("Why you edit it").fill("shipping was charged twice too")
    page.get_by_role("button", name="Preview changes").click()
    page.locator("#edit-diff").wait_for()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
