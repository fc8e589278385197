"""`manage.py soak`, the part that runs inside the soak's own environment (see the command's
docstring): it starts the system, drives it under faults, waits for it to go quiet and prints
what held."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection

from bench import pgstats, soak_faults, soak_report, soak_world
from bench.procs import Child, free_port, start_sandbox, wait_for, wait_ready
from bench.soak_agents import Agent, Approver, Stats
from bench.soak_faults import PrivateRedis, Workers
from bench.soak_report import Row, passed, zero

ROOT = Path(settings.BASE_DIR)
# Shorter than production's defaults so that recovery fits a ten-minute soak; every other
# setting is the product's default (base settings, DEBUG off).
TIMINGS = {
    "LEASE_MARGIN_SECONDS": "3",
    "SWEEP_INTERVAL_SECONDS": "2",
    "OUTBOX_REPUBLISH_AFTER_SECONDS": "10",
    "APPROVAL_SWEEP_SECONDS": "5",
    "CIRCUIT_OPEN_SECONDS": "5",
    "CELERY_VISIBILITY_TIMEOUT": "120",
}
DUPLICATE_RATE = 0.10


class Soak:
    def __init__(self, command: Any, options: dict[str, Any]) -> None:
        self.command, self.options = command, options
        self.rng = random.Random(options["seed"])
        self.tmp = Path(tempfile.mkdtemp(prefix="countersign-soak-"))
        self.log_dir = self.tmp / "logs"
        self.log_dir.mkdir()
        self.database_url = os.environ["DATABASE_URL"]
        self.broker_url = settings.CELERY_BROKER_URL
        self.redis: PrivateRedis | None = None
        self.children: list[Child] = []
        self.workers: Workers | None = None
        self.stats = Stats()
        self.faults: Counter[str] = Counter()
        self.timeline: list[str] = []  # each fault with its wall time, printed on a failure
        self.duplicate_flag = self.tmp / "deliver-twice"
        self.secret_key = secrets.token_urlsafe(40)  # one for the web and the workers

    def say(self, text: str = "") -> None:
        self.command.stdout.write(text)
        self.command.stdout.flush()

    def env(self, sandbox_url: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSIGN_")}
        env.update(TIMINGS)
        env.update(
            DATABASE_URL=self.database_url,
            CELERY_BROKER_URL=self.broker_url,
            DJANGO_SETTINGS_MODULE="config.settings.base",
            DJANGO_DEBUG="0",
            DJANGO_SECRET_KEY=self.secret_key,
            COUNTERSIGN_VAR_DIR=str(self.tmp / "var"),
            COUNTERSIGN_CONNECTORS_FILE=str(self.tmp / "connectors.json"),
            LOG_LEVEL="INFO",
            CELERY_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
            SOAK_DUPLICATE_FLAG=str(self.duplicate_flag),
            SOAK_DUPLICATE_RATE=str(DUPLICATE_RATE),
        )
        if sandbox_url:
            env["SANDBOX_URL"] = sandbox_url
        return env

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> bool:
        opts = self.options
        try:
            tenants, slugs, sandbox_url, web_url = self.start()
            agents = [
                Agent(web_url, t, n, self.stats, self.rng.randrange(2**32), opts["think"])
                for t in tenants
                for n in range(1, opts["agents"] + 1)
            ]
            approvers = [Approver(web_url, t, self.stats) for t in tenants]
            for thread in [*approvers, *agents]:
                thread.start()
            self.say(f"load and faults for {opts['minutes']:g} min ...")
            self.fault_window(opts["minutes"] * 60, sandbox_url)
            for agent in agents:
                agent.stopping.set()
            quiet_after = self.settle(opts["settle_minutes"] * 60, agents)
            for agent in agents:
                agent.finished.set()
            for approver in approvers:
                approver.stopping.set()
            for thread in [*approvers, *agents]:
                thread.join(timeout=60)
            secrets_list = soak_world.secrets_to_find(tenants, slugs, sandbox_url)
            return self.report(sandbox_url, quiet_after, secrets_list)
        finally:
            self.stop_all()
            self.clean_up()

    def start(self) -> tuple[list[soak_world.Tenant], list[str], str, str]:
        opts = self.options
        if opts["inner"] == "private":
            port = int(self.broker_url.rsplit(":", 1)[1].split("/")[0])
            self.redis = PrivateRedis(port, self.tmp, self.log_dir).start()
        self.say(f"database {pgstats.database_name(self.database_url)}, broker {self.broker_url}")
        call_command("migrate", verbosity=0)
        slugs = soak_world.tenant_slugs(opts["tenants"])
        made = soak_world.create(slugs, opts["approval_expiry"])
        extra = [f"--extra-tenant={slug}" for slug in soak_world.extra_tenants(slugs)]
        sandbox, sandbox_url = start_sandbox(
            ROOT, self.env(), self.tmp / "sandbox", self.log_dir, extra
        )
        self.children.append(sandbox)
        soak_world.write_connectors(self.tmp / "connectors.json", slugs, sandbox_url)
        env = self.env(sandbox_url)
        web_url = self.start_web(env)
        self.workers = Workers(ROOT, env, self.log_dir, opts["pool"], opts["concurrency"])
        for _ in range(opts["workers"]):
            self.workers.start_one()
        wait_ready(self.workers.live, env, timeout=120)
        beat = [sys.executable, "-m", "celery", "-A", "bench.soak_app", "beat"]
        beat += ["-s", str(self.tmp / "beat-schedule"), "--loglevel", "INFO"]
        self.children.append(Child("beat", beat, env, ROOT, self.log_dir / "beat.log").start())
        self.say(
            f"started: sandbox {sandbox_url}, web {web_url}, {opts['workers']} workers "
            f"(--pool {opts['pool']} --concurrency {opts['concurrency']}), beat; tenants "
            f"{', '.join(slugs)} with {opts['agents']} agents and 2 approvers each"
        )
        return soak_world.read_sandbox(sandbox_url, made), slugs, sandbox_url, web_url

    def start_web(self, env: dict[str, str]) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}"]
        argv += ["--workers", "2", "--threads", "8", "--timeout", "60"]
        argv += ["--access-logfile", "-", "--error-logfile", "-"]
        web = Child("web", argv, env, ROOT, self.log_dir / "web.log").start()
        self.children.append(web)
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            if not web.alive():
                raise RuntimeError(f"the web server exited: {web.output()[-2000:]}")
            try:
                return httpx.get(f"{url}/login/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, 60, "the web server")
        return url

    # --- faults ----------------------------------------------------------------------------

    def lease_seconds(self) -> float:
        from toolcalls import capabilities

        longest = max(c.timeout for c in capabilities.REGISTRY.values())
        return longest + float(TIMINGS["LEASE_MARGIN_SECONDS"])

    def fault_window(self, window: float, sandbox_url: str) -> None:
        opts, rng, workers = self.options, self.rng, self.workers
        counts = {"pause": opts["pauses"], "db_cut": opts["db_cuts"]}
        counts["redis_restart"] = opts["redis_restarts"]
        counts["pg_restart"] = opts["db_cuts"] if opts["pg_restart_cmd"] else 0
        plan = soak_faults.plan(rng, window, counts)
        self.duplicate_flag.touch()
        soak_faults.sandbox_faults(sandbox_url, on=True)
        started = time.monotonic()
        next_kill, next_note = started + soak_faults.next_kill_in(rng), started + 30
        while (now := time.monotonic()) < started + window:
            workers.resume_due()
            for line in workers.replace_dead():
                self.note(line, "workers that exited by themselves")
            if now >= next_kill:
                self.note(workers.kill(rng), "worker processes killed (SIGKILL)")
                next_kill = now + soak_faults.next_kill_in(rng)
            while plan and plan[0].at <= now - started:
                self.fault(plan.pop(0).kind)
            if now >= next_note:
                self.progress(now - started)
                next_note += 30
            time.sleep(0.2)
        # The faults stop: no more lost requests or answers, copies, or paused workers.
        self.duplicate_flag.unlink()
        soak_faults.sandbox_faults(sandbox_url, on=False)
        workers.resume_due(everyone=True)
        self.say(f"faults stopped after {window:.0f} s: {self.fault_summary()}")

    def fault(self, kind: str) -> None:
        if kind == "pause":
            line = self.workers.pause(self.rng, self.lease_seconds() + self.rng.uniform(2, 5))
            self.note(line, "workers paused (SIGSTOP) past their lease")
        elif kind == "redis_restart":
            if self.redis is None:
                self.note("not restarting a Redis it did not start", "Redis restarts skipped")
                return
            self.redis.restart()
            self.note("restarted redis-server", "Redis restarts")
        elif kind == "db_cut":
            cut = soak_faults.cut_connections(self.database_url)
            self.note(f"terminated {cut} database connections", "database connection cuts")
        elif kind == "pg_restart":
            line = soak_faults.restart_postgres(self.options["pg_restart_cmd"], self.database_url)
            self.note(line, "PostgreSQL restarts")

    def note(self, line: str, counter: str) -> None:
        if not line:
            return
        self.faults[counter] += 1
        self.timeline.append(f"{time.strftime('%H:%M:%S')} {line}")
        if self.options["verbosity"] > 1:
            self.say(f"    {line}")

    def fault_summary(self) -> str:
        return ", ".join(f"{what} {n}" for what, n in self.faults.items())

    def progress(self, elapsed: float) -> None:
        try:
            moving, proposed = soak_report.moving_count(), soak_report.proposed_count()
        except DatabaseError:
            connection.close()
            return
        self.say(f"  {elapsed:4.0f} s: {proposed} calls proposed, {moving} on their way")

    # --- the end ---------------------------------------------------------------------------

    def settle(self, limit: float, agents: list[Agent]) -> float | None:
        """Seconds from the end of the faults until nothing moves by itself any more (the
        agents' follow-ups done, every call settled or with a person), or None."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            self.workers.replace_dead()
            try:
                busy = any(agent.followups for agent in agents) or soak_report.moving_count()
            except DatabaseError:
                connection.close()
                busy = True
            if not busy:
                return time.monotonic() - started
            time.sleep(1)
        return None

    # long: one row per figure of the table, in the order it prints
    def report(self, sandbox_url: str, quiet_after: float | None, secrets_list: list[str]) -> bool:
        ops = soak_report.operations()
        effects = soak_report.effects(sandbox_url)
        fence = soak_report.fencing()
        approvals = soak_report.approvals()
        projections = soak_report.replay("rebuild_projections", "--verify")
        chain = soak_report.replay("verify_event_chain")
        leaks = soak_report.secrets_in_logs(self.log_dir, secrets_list)
        limit = self.options["settle_minutes"] * 60
        rows = [
            Row("operations proposed", str(ops["proposed"])),
            Row("  terminal", str(ops["terminal"])),
            Row("  confirmed without a human", str(ops["confirmed_alone"])),
            Row("  on the unknowns desk (a person owns them)", str(ops["desk"])),
            zero("operations lost", ops["lost"]),
            zero("duplicate external effects (sandbox ledger)", effects["duplicates"]),
            zero("external effects of no operation", effects["orphans"]),
            zero("stale results accepted", fence["stale_accepted"]),
            Row("  stale results refused (the fence held)", str(fence["stale_refused"])),
            zero("approvals consumed twice", approvals["consumed_twice"]),
            zero("approvals consumed for arguments they did not show", approvals["other_args"]),
            Row(
                "time to quiescence after the last fault",
                "never" if quiet_after is None else f"{quiet_after:.0f} s",
                f"< {limit:.0f} s",
                quiet_after is not None,
            ),
            passed("rebuild_projections --verify", projections[0]),
            passed("verify_event_chain", chain[0]),
            zero("secrets found in logs", sum(leaks.values())),
        ]
        held = all(row.ok is not False for row in rows)
        self.say("")
        self.say(f"== soak: {'every invariant held' if held else 'AN INVARIANT FAILED'} ==")
        for line in soak_report.table(rows):
            self.say(line)
        self.say("")
        self.details(ops, effects, approvals, projections, chain, leaks)
        if not held:
            self.clues()
        return held

    def details(self, ops, effects, approvals, projections, chain, leaks) -> None:
        opts = self.options
        self.say(
            f"setup: {opts['tenants']} tenants x {opts['agents']} agents, {opts['workers']} "
            f"workers, {opts['minutes']:g} min of faults, seed {opts['seed']}"
        )
        self.say(
            f"faults: {self.fault_summary()}; sandbox: 10% of answers lost after commit, "
            f"5% of requests before; {DUPLICATE_RATE:.0%} of tasks delivered twice "
            f"({self.copies()} copies sent)"
        )
        self.say(f"external effects in the ledger: {effects['effects']}")
        statuses = ", ".join(f"{s} {n}" for s, n in ops["statuses"].most_common())
        self.say(f"calls by execution/verification: {statuses}")
        self.say(f"approvals by state: {approvals['states']}")
        self.say(f"rebuild_projections: {projections[1]}")
        self.say(f"verify_event_chain: {chain[1]}")
        if leaks:
            self.say(f"secrets found in: {leaks}")
        for key, n in sorted(self.stats.counts.items()):
            self.say(f"  {key}: {n}")
        if ops["lost"]:
            self.say(f"lost calls (the first {min(ops['lost'], 5)} of {ops['lost']}):")
            for line in soak_report.lost_calls():
                self.say(line)
        if opts["keep_logs"]:
            self.say(f"logs: {self.log_dir}")

    def clues(self) -> None:
        """What a failed run's output must carry to be explained later (CI keeps nothing
        else): when each fault came, and when each worker alive at the end last finished a
        task (a worker that stopped consuming after a broker restart shows an early time)."""
        self.say("faults, as they came:")
        for line in self.timeline:
            self.say(f"  {line}")
        self.say("workers alive at the end, and their last finished task:")
        for worker in self.workers.live if self.workers else []:
            self.say(f"  {worker.name} (pid {worker.pid}): {soak_faults.last_task(worker)}")

    def copies(self) -> int:
        return sum(worker.output().count("soak: delivered ") for worker in self.workers.started)

    def stop_all(self) -> None:
        if self.workers:
            self.workers.stop_all()
        for child in reversed(self.children):
            child.stop(timeout=10)
        if self.redis:
            self.redis.stop()

    def clean_up(self) -> None:
        if not self.options["keep_logs"]:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.options["drop_database"]:
            connection.close()
            pgstats.drop_database(self.database_url, pgstats.database_name(self.database_url))
