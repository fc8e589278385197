"""`manage.py demo`: the whole product on the embedded default, in one process.

Migrates the embedded database, seeds tenant `acme` with people whose passwords it prints,
starts the sandbox (the simulated external systems) as a child process, the Celery worker and
beat in threads, the scripted agent, and the console on 127.0.0.1:8000. Ctrl-C stops it all.
"""

from __future__ import annotations

import logging
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.servers.basehttp import WSGIServer, run
from django.core.wsgi import get_wsgi_application
from django.utils import timezone

from examples.demo_agent import DemoAgent
from runs.models import ApiKey, Tenant, User
from runs.services import api_key_issue

DEMO_PEOPLE = [
    ("alice", User.Role.APPROVER),
    ("bob", User.Role.APPROVER),
    ("olivia", User.Role.ADMIN),
    ("agent-owner", User.Role.VIEWER),
]


class Command(BaseCommand):
    help = "Run Countersign on the embedded default with a scripted agent (Ctrl-C stops)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--sandbox-port", type=int, default=8700)
        parser.add_argument("--no-agent", action="store_true", help="no scripted agent")

    def handle(self, *args: object, **options: Any) -> None:
        if not settings.EMBEDDED:
            raise CommandError(
                "demo runs the embedded default; unset CELERY_BROKER_URL (and DATABASE_URL)."
            )
        # The console shows what the worker does; its per-task lines would bury the logins.
        logging.getLogger("celery").setLevel(logging.WARNING)
        call_command("migrate", verbosity=0)
        tenant, passwords = self.seed()
        sandbox = self.start_sandbox(options["sandbox_port"])
        settings.SANDBOX_URL = f"http://127.0.0.1:{options['sandbox_port']}"
        self.inject_faults(settings.SANDBOX_URL)
        from config import embedded

        runtime = embedded.start()
        base_url = f"http://{options['host']}:{options['port']}"
        agent = None
        if not options["no_agent"]:
            agent = DemoAgent(base_url, self.fresh_api_key(tenant))
            agent.start()
        self.stdout.write(f"\nCountersign is running at {base_url}/")
        for username, password in passwords.items():
            role = dict(DEMO_PEOPLE)[username]
            self.stdout.write(f"  log in as {username:<12} password {password}   ({role})")
        self.stdout.write(
            f"Sandbox (external systems) at http://127.0.0.1:{options['sandbox_port']}"
        )
        self.stdout.write("Press Ctrl-C to stop.\n")
        self.stdout.flush()
        try:
            run(
                options["host"],
                options["port"],
                get_wsgi_application(),
                threading=True,
                server_cls=WSGIServer,
            )
        except KeyboardInterrupt:
            pass
        finally:
            # A second Ctrl-C while stopping must not leave the worker or the sandbox behind.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.stdout.write("Stopping: agent, worker, beat, sandbox...")
            if agent:
                agent.stop()
                agent.join(timeout=10)
            runtime.stop()
            sandbox.terminate()
            sandbox.wait(timeout=10)
            self.stdout.write("Stopped.")

    def seed(self) -> tuple[Tenant, dict[str, str]]:
        tenant, _ = Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme Parts"})
        passwords = {}
        for username, role in DEMO_PEOPLE:
            user, _ = User.objects.get_or_create(
                username=username,
                defaults={"tenant": tenant, "role": role, "email": f"{username}@acme.example"},
            )
            # New passwords at every start, printed below: the demo keeps no secret on disk.
            passwords[username] = f"{username}-{secrets.token_hex(3)}"
            user.set_password(passwords[username])
            user.save()
        return tenant, {u: p for u, p in passwords.items() if u != "agent-owner"}

    def fresh_api_key(self, tenant: Tenant) -> str:
        ApiKey.objects.filter(tenant=tenant, name="demo agent", revoked_at=None).update(
            revoked_at=timezone.now()
        )
        owner = User.objects.get(username="agent-owner")
        return api_key_issue(tenant=tenant, name="demo agent", principal=owner, scopes=["*"])[1]

    def inject_faults(self, sandbox_url: str) -> None:
        # Some of what production does to agents: lost answers, rate limits, a slow carrier.
        for faults in (
            {"system": "payments", "drop_response_after_commit": 0.2, "http_429": 0.1},
            {"system": "mailer", "http_5xx": 0.2},
            {"system": "carrier", "lookup_lag_seconds": 2},
        ):
            httpx.post(f"{sandbox_url}/faults", json=faults, timeout=5).raise_for_status()

    def start_sandbox(self, port: int) -> subprocess.Popen:
        data_dir = settings.VAR_DIR / "sandbox"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandbox",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
                "--quiet",
            ],
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                return process
            except httpx.HTTPError:
                if process.poll() is not None:
                    raise CommandError(f"The sandbox exited with {process.returncode}.") from None
                time.sleep(0.2)
        process.terminate()
        raise CommandError(f"The sandbox did not answer on port {port} within 15 s.")
