"""`manage.py demo`: the whole product on the embedded default, in one process.

Checks that its two ports are free, migrates the embedded database, seeds tenant `acme` with
people whose passwords it prints (and writes to var/demo-logins.txt), starts the sandbox (the
simulated external systems) as a child process, the Celery worker and beat in threads, the
scripted agent, and the console on 127.0.0.1:8000. Ctrl-C or SIGTERM stops it all.
"""

from __future__ import annotations

import logging
import logging.config
import secrets
import signal
import socket
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

from examples import demo_agents
from runs.models import ApiKey, Tenant, User
from runs.services import api_key_issue

DEMO_PEOPLE = [
    ("alice", User.Role.APPROVER),
    ("bob", User.Role.APPROVER),
    ("olivia", User.Role.ADMIN),
    ("agent-owner", User.Role.VIEWER),
]


def celery_warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not record.name.startswith(("celery", "kombu"))


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


class Command(BaseCommand):
    help = (
        "Run Countersign on the embedded default (SQLite, an in-process worker and beat) with "
        "the simulated external systems and a scripted agent. Ctrl-C or SIGTERM stops it all."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host", default="127.0.0.1", help="address the console listens on (127.0.0.1)"
        )
        parser.add_argument(
            "--port", type=int, default=8000, help="port of the console (8000); links use it"
        )
        parser.add_argument(
            "--sandbox-port",
            type=int,
            default=8700,
            help="port of the simulated external systems (8700)",
        )
        parser.add_argument(
            "--no-agent",
            action="store_true",
            help="start no scripted agent: drive the API yourself",
        )
        parser.add_argument(
            "--agent",
            default="scripted",
            choices=sorted(demo_agents.AGENTS),
            help="the agent to run (scripted): "
            + "; ".join(f"{name}: {c.help}" for name, c in demo_agents.AGENTS.items()),
        )

    def handle(self, *args: object, **options: Any) -> None:
        if not settings.EMBEDDED:
            raise CommandError(
                "demo runs the embedded default; unset CELERY_BROKER_URL (and DATABASE_URL)."
            )
        self.check_ports(options["host"], options["port"], options["sandbox_port"])
        self.quiet_celery()
        call_command("migrate", verbosity=0)
        tenant, passwords = self.seed()
        base_url = f"http://{options['host']}:{options['port']}"
        # Links in the approvers' e-mails point at the console this demo really serves.
        settings.COUNTERSIGN_BASE_URL = base_url
        sandbox = self.start_sandbox(options["sandbox_port"])
        settings.SANDBOX_URL = f"http://127.0.0.1:{options['sandbox_port']}"
        self.inject_faults(settings.SANDBOX_URL)
        from config import embedded

        runtime = embedded.start()
        agent = None
        if not options["no_agent"]:
            agent = demo_agents.start(options["agent"], base_url, self.fresh_api_key(tenant))
        self.print_logins(base_url, passwords, options["sandbox_port"])
        # SIGTERM (a service manager, `kill`) stops everything the way Ctrl-C does.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
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
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stdout.write("Stopping: agent, worker, beat, sandbox...")
            if agent:
                agent.stop()
                agent.join(timeout=10)
            runtime.stop()
            sandbox.terminate()
            sandbox.wait(timeout=10)
            self.stdout.write("Stopped.")

    def check_ports(self, host: str, port: int, sandbox_port: int) -> None:
        """Refuse to start next to another process on our ports: the demo would talk to
        another sandbox, or print logins for a console that is not this one."""
        if port_in_use(host, port):
            raise CommandError(
                f"Port {port} is in use (another demo or server?). "
                f"Stop it, or choose another port: manage.py demo --port {port + 1}"
            )
        if port_in_use("127.0.0.1", sandbox_port):
            raise CommandError(
                f"Port {sandbox_port} is in use (another demo's sandbox?). Stop it, or "
                f"choose another port: manage.py demo --sandbox-port {sandbox_port + 1}"
            )

    def quiet_celery(self) -> None:
        """The terminal is for the logins and what goes wrong; the worker's per-task INFO
        lines would bury them (the run pages show what the worker does). The filter goes into
        the LOGGING setting itself, because a starting worker runs django.setup() again,
        which rebuilds the handlers from it."""
        config = settings.LOGGING
        config.setdefault("filters", {})["celery_warnings_only"] = {
            "()": "django.utils.log.CallbackFilter",
            "callback": celery_warnings_only,
        }
        config["handlers"]["console"].setdefault("filters", []).append("celery_warnings_only")
        logging.config.dictConfig(config)

    def print_logins(self, base_url: str, passwords: dict[str, str], sandbox_port: int) -> None:
        lines = [f"Countersign is running at {base_url}/"]
        for username, password in passwords.items():
            role = dict(DEMO_PEOPLE)[username]
            lines.append(f"  log in as {username:<12} password {password}   ({role})")
        lines.append(f"Sandbox (external systems) at http://127.0.0.1:{sandbox_port}")
        logins = settings.VAR_DIR / "demo-logins.txt"
        logins.write_text("\n".join(lines) + "\n")
        logins.chmod(0o600)  # passwords: for this machine's user only
        self.stdout.write("\n" + "\n".join(lines))
        self.stdout.write(f"(also written to {logins})")
        self.stdout.write("Press Ctrl-C to stop.\n")
        self.stdout.flush()

    def seed(self) -> tuple[Tenant, dict[str, str]]:
        tenant, _ = Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme Parts"})
        passwords = {}
        for username, role in DEMO_PEOPLE:
            user, _ = User.objects.get_or_create(
                username=username,
                defaults={"tenant": tenant, "role": role, "email": f"{username}@acme.example"},
            )
            # New passwords at every start, printed below and kept in var/demo-logins.txt.
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
