"""Approve click → dispatch started, with idle workers or while bulk work keeps them busy.

    python manage.py bench_approve --database countersign_bench_approve --redis-db 3 \
        --clicks 100 --load dispatch

Proposes `--clicks` refunds over the approval threshold, one at a time; for each, an approver
logged in through the login page posts the console's approve endpoint (Django's test Client in
a child process: the whole request, middleware to redirect), and the time is taken from the
POST's start to the `occurred_at` of the call's `tool_call.dispatching` event, written by a
real `celery -A config worker` process. Prints p50/p95/p99 of that, the POST's own time, and
with `--load dispatch` how many auto-authorized background calls per second reached
`dispatching` while the clicks ran (proposed by another child process, as bench_dispatch
does) and how long the bulk queue was at each click.

Ownership as in bench_dispatch: the database `--database` is created with a comment that marks
it as this benchmark's, a database of that name without the mark is refused, and one with it
is dropped only with `--recreate`; the Redis database `--redis-db` is emptied only when it is
empty or holds this benchmark's mark. The sandbox runs in a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench import pgstats
from bench.analyze import AutoAnalyze
from bench.analyze import describe as describe_analyze
from bench.approve_drive import CLICK_CAPTURED_CENTS, FIRST_CLICK_ORDER
from bench.driver import FIRST_ORDER
from bench.ownership import Owner, redis_db
from bench.procs import Child, add_worker_sizing, start_sandbox, start_worker, wait_for, wait_ready
from bench.sandbox_http import add_orders

OWNER = Owner("bench_approve")
MARK, REDIS_MARK = OWNER.mark, OWNER.redis_mark
own_database, claim_redis = OWNER.own_database, OWNER.claim_redis
ROOT = Path(settings.BASE_DIR)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Command(BaseCommand):
    help = "Approve click -> dispatch started, idle or under bulk load (prints figures)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", required=True, help="its PostgreSQL database")
        parser.add_argument("--redis-db", type=int, required=True, help="its Redis database")
        parser.add_argument("--recreate", action="store_true")
        parser.add_argument("--clicks", type=int, default=100)
        parser.add_argument("--gap", type=float, default=0.1, help="seconds between clicks")
        parser.add_argument(
            "--warmup-clicks",
            type=int,
            default=1,
            help="clicks made first and not counted (the first request of a process fills "
            "its caches: URL resolver, policies, validators)",
        )
        parser.add_argument("--load", choices=["none", "dispatch"], default="none")
        parser.add_argument("--load-calls", type=int, default=16000, help="at most, proposed")
        parser.add_argument("--load-threads", type=int, default=4)
        parser.add_argument(
            "--load-nice",
            type=int,
            default=10,
            help="the load's CPU priority: it stands for the agents' requests, which the "
            "Procfile's `api` line serves at WEB_NICE 10 (0 for normal priority, as the "
            "console's process)",
        )
        parser.add_argument("--warmup", type=float, default=3, help="seconds of load first")
        parser.add_argument(
            "--backlog",
            type=int,
            default=8000,
            help="bulk calls proposed before workers start: enough that they never run dry "
            "during the clicks (the report prints the calls waiting at each click; 3000 "
            "left as few as 4 on a machine that ran 150 bulk calls/s)",
        )
        parser.add_argument("--workers", type=int, default=2)
        add_worker_sizing(parser)
        parser.add_argument(
            "--interactive-workers",
            type=int,
            default=1,
            help="more workers that take only the `interactive` queue (-Q interactive)",
        )
        parser.add_argument("--interactive-concurrency", type=int, default=2)
        parser.add_argument(
            "--bulk-nice",
            type=int,
            default=10,
            help="the bulk workers' WORKER_NICE (the Procfile's: 10; 0 for normal priority)",
        )
        parser.add_argument("--timeout", type=float, default=10, help="seconds per click")
        parser.add_argument("--profile", action="store_true", help="print the POST's profile")
        parser.add_argument("--inner", choices=["setup", "load", "clicks"], help="(internal)")
        parser.add_argument("--inner-file", help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["inner"]:
            self._inner(options)
            return
        if min(options[k] for k in ("clicks", "concurrency", "send_threads")) < 1:
            raise CommandError("--clicks, --concurrency and --send-threads must be at least 1.")
        if options["load"] == "dispatch" and options["load_calls"] < options["backlog"] + 100:
            raise CommandError("--load-calls must exceed --backlog by at least 100.")
        database_url, broker_url = OWNER.check_environment()
        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            Bench(self, options, database_url, broker_url).run()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _inner(self, options: dict[str, Any]) -> None:
        from bench import approve_drive, driver

        name = settings.DATABASES["default"]["NAME"]
        if pgstats.database_comment(os.environ["DATABASE_URL"], name) != MARK:
            raise CommandError(f"--inner runs only on a database bench_approve made, not {name}.")
        path = options["inner_file"]
        spec = json.loads(Path(path).read_text())
        phase = getattr(approve_drive, options["inner"])
        driver.write_json(path, phase(**spec))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


class Bench:
    def __init__(self, command: Command, options: dict[str, Any], db_url: str, broker: str):
        self.command, self.options = command, options
        self.db = options["database"]
        self.url = pgstats.with_database(db_url, self.db)
        self.broker = redis_db(broker, options["redis_db"])
        self.children: list[Child] = []
        self.loader: subprocess.Popen | None = None
        self.analyzer: AutoAnalyze | None = None

    def say(self, text: str = "") -> None:
        self.command.stdout.write(text)
        self.command.stdout.flush()

    def env(self, sandbox_url: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "COUNTERSIGN_CONNECTORS_FILE"}
        env.update(
            DATABASE_URL=self.url,
            DISPATCH_SEND_THREADS=str(self.options["send_threads"]),
            CELERY_BROKER_URL=self.broker,
            DJANGO_SETTINGS_MODULE="config.settings.base",
            DJANGO_DEBUG="0",
            CELERY_LOG_LEVEL="WARNING",
            LOG_LEVEL="WARNING",
            PYTHONUNBUFFERED="1",
        )
        if sandbox_url:
            env["SANDBOX_URL"] = sandbox_url
        return env

    # long: the run in order, each step a line: own, start, set up, load, click, report
    def run(self) -> None:
        opts = self.options
        tmp = Path(tempfile.mkdtemp(prefix="countersign-bench-approve-"))
        try:
            own_database(self.url, self.db, opts["recreate"])
            self.migrate()
            self.start_maintenance()
            claim_redis(self.broker)
            sandbox, sandbox_url = start_sandbox(ROOT, self.env(), tmp / "sandbox", tmp)
            self.children.append(sandbox)
            load_calls = opts["load_calls"] if opts["load"] == "dispatch" else 0
            clicks = opts["clicks"] + opts["warmup_clicks"]
            env = self.env(sandbox_url)
            setup = self.inner(
                "setup", {"clicks": clicks, "load_calls": load_calls}, self.env(), tmp
            )
            offset = setup["offset"]
            add_orders(sandbox_url, max(1, load_calls), first=FIRST_ORDER + offset)
            add_orders(
                sandbox_url,
                clicks,
                first=FIRST_CLICK_ORDER + offset,
                captured_cents=CLICK_CAPTURED_CENTS,
            )
            stop_file, backlog_file = tmp / "stop-load", tmp / "backlog-proposed"
            loader = None
            if load_calls:
                spec = {
                    "run_ids": setup["load_runs"],
                    "calls": load_calls,
                    "threads": opts["load_threads"],
                    "stop_file": str(stop_file),
                    "offset": offset,
                    "backlog": opts["backlog"],
                    "backlog_file": str(backlog_file),
                    "nice": opts["load_nice"],
                }
                loader = self.start_inner("load", spec, env, tmp)
                self.loader = loader
                self.say(
                    f"proposing a backlog of {opts['backlog']} bulk calls before the workers start"
                )
                wait_for(
                    lambda: backlog_file.exists() or loader.poll() is not None, 900, "the backlog"
                )
                if loader.poll() is not None:
                    raise CommandError(f"the load failed: {(tmp / 'load.log').read_text()[-3000:]}")
            # As the Procfile runs them: the bulk workers take only `celery`, below normal CPU
            # priority, when a worker of their own takes `interactive`.
            bulk_queues = "celery" if opts["interactive_workers"] else ""
            workers = [
                start_worker(
                    ROOT,
                    env,
                    tmp,
                    i + 1,
                    opts["pool"],
                    opts["concurrency"],
                    "config",
                    queues=bulk_queues,
                    nice=opts["bulk_nice"],
                )
                for i in range(opts["workers"])
            ] + [
                start_worker(
                    ROOT,
                    env,
                    tmp,
                    i + 1,
                    opts["pool"],
                    opts["interactive_concurrency"],
                    "config",
                    prefix="interactive",
                    queues="interactive",
                )
                for i in range(opts["interactive_workers"])
            ]
            self.children.extend(workers)
            wait_ready(workers, env)
            if loader is not None:
                time.sleep(opts["warmup"])
            spec = {
                "run_ids": setup["click_runs"],
                "password": setup["password"],
                "gap": opts["gap"],
                "timeout": opts["timeout"],
                "broker": self.broker,
                "offset": offset,
                "profile": opts["profile"],
                "warmup": opts["warmup_clicks"],
            }
            result = self.inner("clicks", spec, env, tmp)
            load_result = None
            if loader is not None:
                stop_file.touch()
                loader.wait(timeout=120)
                load_result = json.loads((tmp / "load.json").read_text())
            self.report(result, load_result)
        finally:
            if self.loader is not None and self.loader.poll() is None:
                self.loader.terminate()  # interrupted: it would go on proposing, orphaned
                self.loader.wait(timeout=30)
            for child in reversed(self.children):
                child.stop()
            if self.analyzer is not None:
                self.analyzer.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    def start_maintenance(self) -> None:
        # A server with autovacuum off (this machine's CI settings) leaves every table of the
        # new database unanalyzed and unvacuumed for the whole run: plans chosen without
        # statistics (the run looked up through its tenant's index, every run of the tenant
        # filtered), the outbox's index of undone rows never cleaned. Production runs
        # autovacuum; so the benchmark runs its rules, as bench_dispatch does.
        self.analyzer = AutoAnalyze(pgstats.conninfo(self.url))
        self.analyzer.start()

    def migrate(self) -> None:
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode:
            raise CommandError(f"migrating {self.db} failed:\n{done.stderr[-3000:]}")

    def argv(self, phase: str, path: Path) -> list[str]:
        return [
            sys.executable,
            "manage.py",
            "bench_approve",
            "--inner",
            phase,
            "--inner-file",
            str(path),
            "--database",
            self.db,
            "--redis-db",
            str(self.options["redis_db"]),
        ]

    def start_inner(self, phase: str, spec: dict, env: dict[str, str], tmp: Path):
        path = tmp / f"{phase}.json"
        path.write_text(json.dumps(spec))
        log = (tmp / f"{phase}.log").open("wb")
        # A session of its own, as a supervisor starts the Procfile's `api` line: a process
        # of its own scheduling group (config/priority.py), not one of the clicking process's.
        return subprocess.Popen(
            self.argv(phase, path), cwd=ROOT, env=env, stderr=log, start_new_session=True
        )

    def inner(self, phase: str, spec: dict, env: dict[str, str], tmp: Path) -> dict[str, Any]:
        path = tmp / f"{phase}.json"
        path.write_text(json.dumps(spec))
        done = subprocess.run(
            self.argv(phase, path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        if done.returncode:
            raise CommandError(f"the {phase} phase failed:\n{done.stderr[-4000:]}")
        return json.loads(path.read_text())

    def report(self, r: dict[str, Any], load: dict[str, Any] | None) -> None:
        opts = self.options
        d, p = r["dispatching"], r["post"]
        self.say("== bench_approve =========================================================")
        self.say(
            f"  {opts['workers']} workers x --pool {opts['pool']} --concurrency "
            f"{opts['concurrency']}, DISPATCH_SEND_THREADS {opts['send_threads']} "
            f"(WORKER_NICE {opts['bulk_nice']}"
            f"{', -Q celery' if opts['interactive_workers'] else ''}), "
            f"the load at nice {opts['load_nice']}, "
            f"{opts['interactive_workers']} more x -Q interactive "
            f"--concurrency {opts['interactive_concurrency']}; --load {opts['load']}; "
            f"{r['clicks']} clicks (after {opts['warmup_clicks']} not counted), "
            f"{opts['gap']} s apart; load average {os.getloadavg()[0]:.1f}"
        )
        analyzed = dict(self.analyzer.analyzed) if self.analyzer and self.analyzer.off else None
        self.say(f"  maintenance: {describe_analyze(analyzed)}")
        self.say(
            f"  click -> tool_call.dispatching: p50 {d['p50']:.1f} ms, p95 {d['p95']:.1f} ms, "
            f"p99 {d['p99']:.1f} ms, max {d['max']:.1f} ms "
            f"({r['clicks'] - r['reached']} of {r['clicks']} "
            f"not dispatching within --timeout {opts['timeout']:.0f} s: counted as inf)"
        )
        self.say(
            f"  the approve POST itself (in-process, login session, business check at the "
            f"sandbox): p50 {p['p50']:.1f} ms, p95 {p['p95']:.1f} ms, p99 {p['p99']:.1f} ms"
        )
        c = r["post_cpu"]
        self.say(
            f"  the approve POST's CPU in the clicking process (thread time, with the profiler's "
            f"own when --profile): p50 {c['p50']:.1f} ms, p99 {c['p99']:.1f} ms; "
            f"{r['post_queries']} statements in {r['post_round_trips']} round trips per POST "
            "(the last click; not counting the transaction's BEGIN and COMMIT, which "
            "CaptureQueriesContext counted: 2 more); the clicking thread's waits (voluntary "
            f"context switches) per POST: p50 {r['post_waits']['p50']:.0f}, "
            f"p99 {r['post_waits']['p99']:.0f}; its COMMIT (waits for the WAL's flush to "
            f"disk): p50 {r['post_commit']['p50']:.1f} ms, p99 {r['post_commit']['p99']:.1f} ms"
        )
        h = r["hop"]
        self.say(
            f"  tool_call.authorized (written inside the POST's transaction) -> dispatching: "
            f"p50 {h['p50']:.1f} ms, p95 {h['p95']:.1f} ms, p99 {h['p99']:.1f} ms"
        )
        w, c = r["receive"], r["claim"]
        self.say(
            f"  the hand-off's parts: authorized -> the worker's task starts (its claim marks the "
            f"outbox message done): p50 {w['p50']:.1f} ms, p95 {w['p95']:.1f} ms, p99 "
            f"{w['p99']:.1f} ms; the claim, task start -> dispatching: p50 {c['p50']:.1f} ms, "
            f"p95 {c['p95']:.1f} ms, p99 {c['p99']:.1f} ms"
        )
        for s in r["slowest"]:
            self.say(
                f"  slow click: {_ms(s['dispatching_ms'])} ms = the POST {s['post_ms']:.1f} ms "
                f"(CPU {s['post_cpu_ms']:.1f}, {s['post_waits']} waits; waiting for a core: "
                f"{s['post_runqueue_ms']:.1f} ms; its database backend ran "
                f"{s['post_backend_ran_ms']:.1f} ms, waited for a core "
                f"{s['post_backend_runqueue_ms']:.1f} ms; the business check at the sandbox "
                f"{s['post_check_ms']:.1f} ms; its COMMIT {s['post_commit_ms']:.1f} ms), "
                f"authorized -> task "
                f"start {_ms(s['receive_ms'])} ms, the claim {_ms(s['claim_ms'])} ms"
            )
        if load is not None:
            self.say(
                f"  background: {r['background_per_s']:.1f} auto-authorized calls/s reached "
                f"dispatching during the {r['window_s']:.1f} s of clicks ({load['proposed']} "
                f"proposed by {opts['load_threads']} threads in {load['seconds']:.1f} s, "
                f"{load['error_count']} refused); "
                f"bulk queue 'celery' at each click: p50 {r['backlog']['p50']}, "
                f"max {r['backlog']['max']} messages; bulk calls authorized and not yet "
                f"claimed at each click: min {r['authorized']['min']}, p50 "
                f"{r['authorized']['p50']:.0f} (0: the workers had run dry)"
            )
            for sample in load["errors"]:
                self.say(f"    load error: {sample}")
        if r["profile"]:
            self.say(r["profile"])
