"""Benchmark the tool-call lifecycle end to end on PostgreSQL, Redis and real Celery workers.

    python manage.py bench_dispatch --database countersign_bench --redis-db 2 \
        --dbos-database countersign_bench_dbos --calls 2000 --workers 2

Proposes `--calls` auto-authorized refunds through `toolcalls.propose.tool_call_propose`,
lets real `celery -A config worker` processes dispatch and verify them against the sandbox,
and prints throughput, latency to `accepted`, database work per call (measured on the server),
CPU milliseconds per call of every process that did the work, the workers' peak memory and the
invariant (one ledger effect per call); then runs the DBOS Transact baseline
(`bench/dbos_baseline.py`) on the same server and sandbox and prints the same for it, and the
ratios.

It touches only what it is given and what it made. The databases named by `--database` and
`--dbos-database` are created with a comment that marks them as the benchmark's; a database of
that name without the mark is refused, and one with it is dropped and created again only with
`--recreate` (otherwise reused). The Redis database `--redis-db` (on the server of
$CELERY_BROKER_URL) is emptied only when it is empty already or holds the benchmark's mark. The
sandbox runs in a temporary directory, and every call refunds an order of its own (added with
the sandbox's `POST /orders`), so no answer grows with `--calls`. The measuring part runs in a
child process of this command with that environment (`--inner`), as do the workers.
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
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench import WORKER_DRAINED, WORKER_STATEMENTS, WORKER_TASKS, drained_line, pgreport, pgstats
from bench.analyze import describe as describe_analyze
from bench.cpu import BackendCpu
from bench.driver import FIRST_ORDER
from bench.ownership import Owner, redis_db
from bench.procs import (
    MemorySampler,
    add_worker_sizing,
    cpu_snapshot,
    start_sandbox,
    start_worker,
    wait_ready,
)
from bench.sandbox_http import add_orders, ledger

# The comment on the databases it creates, and the key it leaves in its Redis database: proof,
# on the next run, that they are the benchmark's to empty.
OWNER = Owner("bench_dispatch")
MARK, REDIS_MARK = OWNER.mark, OWNER.redis_mark
refuse_foreign, own_database, claim_redis = (
    OWNER.refuse_foreign,
    OWNER.own_database,
    OWNER.claim_redis,
)
ROOT = Path(settings.BASE_DIR)


class Command(BaseCommand):
    help = "Benchmark proposals -> dispatch -> verification with real workers, and DBOS."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", required=True, help="its PostgreSQL database")
        parser.add_argument(
            "--dbos-database", help="the DBOS baseline's database (needed unless --skip-baseline)"
        )
        parser.add_argument(
            "--redis-db", type=int, required=True, help="its Redis database number (0-15)"
        )
        parser.add_argument(
            "--recreate",
            action="store_true",
            help="drop and create again the databases when they carry the benchmark's mark",
        )
        parser.add_argument("--calls", type=int, default=2000)
        parser.add_argument("--workers", type=int, default=2, help="celery worker processes")
        add_worker_sizing(parser)
        parser.add_argument(
            "--celery-app",
            default="bench.counting",
            help="celery -A module (default: the project's app, counting SQL statements)",
        )
        parser.add_argument("--calls-per-run", type=int, default=20)
        parser.add_argument("--propose-threads", type=int, default=4)
        parser.add_argument(
            "--rate",
            type=float,
            default=0,
            help="proposals per second, paced (0: as fast as the threads go); below the "
            "machine's saturation the latencies are the pipeline's, not a queue's",
        )
        parser.add_argument("--timeout", type=float, default=900, help="seconds for everything")
        parser.add_argument("--skip-baseline", action="store_true")
        parser.add_argument("--baseline-threads", type=int, default=8)
        parser.add_argument("--baseline-steps", choices=["http", "trivial"], default="http")
        parser.add_argument("--keep-logs", action="store_true", help="print the log directory")
        # Internal: the measuring child process.
        parser.add_argument("--inner", choices=["setup", "drive"], help="(internal)")
        parser.add_argument("--inner-file", help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["inner"]:
            self._inner(options)
            return
        if min(options[k] for k in ("calls", "workers", "concurrency", "send_threads")) < 1:
            raise CommandError(
                "--calls, --workers, --concurrency and --send-threads must be at least 1."
            )
        if not options["skip_baseline"] and not options["dbos_database"]:
            raise CommandError("name the baseline's database (--dbos-database) or --skip-baseline")
        if options["dbos_database"] == options["database"]:
            raise CommandError("--dbos-database must differ from --database.")
        database_url, broker_url = OWNER.check_environment()
        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            ok = Bench(self, options, database_url, broker_url).run()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if not ok:
            raise CommandError("the benchmark failed its invariant; see above.")

    def _inner(self, options: dict[str, Any]) -> None:
        from bench import driver

        name = settings.DATABASES["default"]["NAME"]
        if pgstats.database_comment(os.environ["DATABASE_URL"], name) != MARK:
            raise CommandError(f"--inner runs only on a database the benchmark made, not {name}.")
        path = options["inner_file"]
        spec = json.loads(Path(path).read_text())
        if options["inner"] == "setup":
            result = driver.setup(spec["calls"], spec["calls_per_run"])
        else:
            result = driver.drive(
                calls=spec["calls"],
                run_ids=spec["run_ids"],
                threads=spec["propose_threads"],
                rate=spec.get("rate", 0),
                tag=spec["tag"],
                timeout=spec["timeout"],
            )
        driver.write_json(path, result)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Bench:
    def __init__(self, command: Command, options: dict[str, Any], db_url: str, broker: str):
        self.command, self.options = command, options
        self.bench_db, self.dbos_db = options["database"], options["dbos_database"]
        self.bench_url = pgstats.with_database(db_url, self.bench_db)
        self.dbos_url = pgstats.with_database(db_url, self.dbos_db or self.bench_db)
        self.broker = redis_db(broker, options["redis_db"])
        self.deadline = time.monotonic() + options["timeout"]
        self.load = os.getloadavg()  # other work on this machine skews the figures
        self.sandbox = None
        self.workers: list = []
        self.sampler: MemorySampler | None = None
        self.cpu_per_call: dict[str, float] = {}

    def say(self, text: str = "") -> None:
        self.command.stdout.write(text)
        self.command.stdout.flush()

    def remaining(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CommandError(f"--timeout {self.options['timeout']:.0f} s reached ({what}).")
        return left

    def env(self, sandbox_url: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "COUNTERSIGN_CONNECTORS_FILE"}
        env.update(
            DATABASE_URL=self.bench_url,
            DISPATCH_SEND_THREADS=str(self.options["send_threads"]),
            CELERY_BROKER_URL=self.broker,
            DJANGO_SETTINGS_MODULE="config.settings.base",
            DJANGO_DEBUG="0",  # DEBUG would keep every query in memory
            CELERY_LOG_LEVEL="WARNING",
            LOG_LEVEL="WARNING",
            PYTHONUNBUFFERED="1",
        )
        if sandbox_url:
            env["SANDBOX_URL"] = sandbox_url
        return env

    # --- the run ---------------------------------------------------------------------------

    # long: the run in order, each step a line: start, measure, stop, report, baseline
    def run(self) -> bool:
        opts = self.options
        tmp = Path(tempfile.mkdtemp(prefix="countersign-bench-"))
        try:
            # Both databases are checked before either is touched.
            refuse_foreign(self.bench_url, self.bench_db)
            if self.dbos_db and not opts["skip_baseline"]:
                refuse_foreign(self.dbos_url, self.dbos_db)
            self.prepare_database()
            claim_redis(self.broker)
            self.sandbox, sandbox_url = start_sandbox(ROOT, self.env(), tmp / "sandbox", tmp)
            add_orders(sandbox_url, opts["calls"])
            env = self.env(sandbox_url)
            self.workers = [
                start_worker(
                    ROOT, env, tmp, i + 1, opts["pool"], opts["concurrency"], opts["celery_app"]
                )
                for i in range(opts["workers"])
            ]
            wait_ready(self.workers, env, timeout=min(60, self.remaining("starting workers")))
            self.sampler = MemorySampler(self.workers)
            self.sampler.start()

            spec = {"calls": opts["calls"], "calls_per_run": opts["calls_per_run"]}
            setup = self.inner("setup", spec, env, tmp)
            statements_reason = pgstats.pg_stat_statements_state(self.bench_url)
            if not statements_reason and not pgstats.statements_reset(self.bench_url):
                statements_reason = "pg_stat_statements could not be created in the bench db"
            tables_before = pgstats.table_counters(self.bench_url)
            indexes_before = pgreport.index_counters(self.bench_url)
            before = pgstats.database_counters(self.bench_url, self.bench_db)
            spec = {
                "calls": opts["calls"],
                "run_ids": setup["run_ids"],
                "propose_threads": opts["propose_threads"],
                "rate": opts["rate"],
                "tag": uuid.uuid4().hex[:8],
                "timeout": max(10.0, self.remaining("before proposing") - 30),
            }
            self.load = os.getloadavg()
            backends = BackendCpu(self.bench_url, self.bench_db)
            backends.start()
            cpu_before = cpu_snapshot(self.workers, self.sandbox)
            result = self.inner("drive", spec, env, tmp)
            cpu = pgstats.delta(cpu_snapshot(self.workers, self.sandbox), cpu_before)
            cpu["proposer"] = result["driver_cpu"]
            cpu["postgres"] = backends.stop()
            result["backends"] = backends.backends_seen

            self.sampler.stop()
            for worker in self.workers:
                worker.stop()  # their backends exit and flush their statistics
            time.sleep(1.5)
            after = pgstats.database_counters(self.bench_url, self.bench_db)
            statements = None if statements_reason else pgstats.statements_count(self.bench_url)
            tables_after = pgstats.table_counters(self.bench_url)
            indexes_after = pgreport.index_counters(self.bench_url)
            effects = ledger(sandbox_url)

            worker_statements = int(redis.Redis.from_url(self.broker).get(WORKER_STATEMENTS) or 0)
            ok = self.report(result, before, after, tables_before, tables_after, effects, cpu)
            if worker_statements:
                per_call = (worker_statements + result["propose_statements"]) / opts["calls"]
                self.say(
                    f"  SQL statements/call (counted in the processes): {per_call:.1f} "
                    f"(workers {worker_statements / opts['calls']:.1f}, proposals "
                    f"{result['propose_statements'] / opts['calls']:.1f})"
                )
            tasks = redis.Redis.from_url(self.broker).hgetall(WORKER_TASKS)
            runs = {k.decode(): int(v) / opts["calls"] for k, v in sorted(tasks.items())}
            self.say(
                f"  Celery messages/call (tasks the workers ran): {sum(runs.values()):.3f} ("
                + ", ".join(f"{name} {n:.3f}" for name, n in runs.items())
                + ")"
            )
            self.say(drained_line(redis.Redis.from_url(self.broker).hgetall(WORKER_DRAINED)))
            self.say(f"  pg_stat_statements: {statements_reason or 'used'}")
            if statements is not None:
                per_call = (statements - result["monitor_statements"]) / opts["calls"]
                self.say(f"  statements/call (pg_stat_statements): {per_call:.1f}")
                self.say("\n".join(pgreport.statement_lines(self.bench_url, opts["calls"])))
            self.say("\n".join(pgreport.index_lines(indexes_before, indexes_after, opts["calls"])))
            ours = result["confirmed"] / result["elapsed"] if result.get("elapsed") else 0.0

            if opts["skip_baseline"]:
                self.say("\nDBOS baseline: skipped (--skip-baseline)")
            else:
                httpx.post(f"{sandbox_url}/reset", timeout=30).raise_for_status()
                add_orders(sandbox_url, opts["calls"])
                self.baseline(sandbox_url, tmp, ours, self.cpu_per_call)
            if opts["keep_logs"]:
                self.say(f"\nlogs: {tmp}")
            return ok
        finally:
            self.stop_all()
            if not opts["keep_logs"]:
                shutil.rmtree(tmp, ignore_errors=True)

    def prepare_database(self) -> None:
        own_database(self.bench_url, self.bench_db, self.options["recreate"])
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=min(300, self.remaining("migrating")),
        )
        if migrate.returncode:
            raise CommandError(f"migrating {self.bench_db} failed:\n{migrate.stderr[-3000:]}")

    def inner(self, phase: str, spec: dict, env: dict[str, str], tmp: Path) -> dict[str, Any]:
        path = tmp / f"{phase}.json"
        path.write_text(json.dumps(spec))
        argv = [sys.executable, "manage.py", "bench_dispatch", "--inner", phase]
        argv += ["--inner-file", str(path), "--database", self.bench_db]
        argv += ["--redis-db", str(self.options["redis_db"])]
        try:
            done = subprocess.run(
                argv,
                cwd=ROOT,
                env=env,
                timeout=self.remaining(phase),
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandError(f"the {phase} phase did not finish before --timeout") from exc
        if done.returncode:
            raise CommandError(f"the {phase} phase failed:\n{done.stderr[-4000:]}")
        return json.loads(path.read_text())

    def stop_all(self) -> None:
        if self.sampler:
            self.sampler.stop()
        for worker in self.workers:
            worker.stop()
        if self.sandbox:
            self.sandbox.stop()

    # --- output ----------------------------------------------------------------------------

    def report(self, r, before, after, tables_before, tables_after, effects, cpu) -> bool:
        opts, calls = self.options, self.options["calls"]
        db = pgstats.delta(after, before)
        # Every statement of the waiting loop ran in autocommit: one commit each.
        commits = db["xact_commit"] - r["monitor_statements"]
        ended = r.get("ended")
        r["elapsed"] = (ended - r["started"]) if ended else None
        request_ids = {e["request_id"] for e in effects}
        invariant = len(effects) == calls and len(request_ids) == calls
        complete = r["confirmed"] == calls and not r["timed_out"]

        paced = f" paced at {opts['rate']:g} calls/s" if opts["rate"] else ""
        self.say("")
        self.say("== bench_dispatch ==========================================================")
        self.say(
            f"  setup: {calls} calls over {-(-calls // opts['calls_per_run'])} runs "
            f"({opts['calls_per_run']}/run), {opts['propose_threads']} proposing threads"
            f"{paced}; "
            f"{opts['workers']} workers x --pool {opts['pool']} --concurrency "
            f"{opts['concurrency']}, DISPATCH_SEND_THREADS {opts['send_threads']} "
            f"(-A {opts['celery_app']}); no beat"
        )
        self.say(
            f"  completed+confirmed_success: {r['confirmed']}/{calls}  failed: {r['failed']}  "
            f"propose errors: {r['propose_errors']}  timed out: {r['timed_out']}"
        )
        for sample in r["propose_error_samples"]:
            self.say(f"    {sample}")
        if not complete:
            self.say(f"  statuses: {r['statuses']}")
        if r["elapsed"]:
            self.say(
                f"  throughput: {r['confirmed'] / r['elapsed']:.1f} calls/s "
                f"({r['elapsed']:.2f} s from first proposal to last confirmed_success; "
                f"proposing took {r['proposals_done'] - r['started']:.2f} s)"
            )
        lat = r["accepted_latency"]
        self.say(
            f"  proposal -> accepted: p50 {lat['p50'] * 1000:.0f} ms, p99 "
            f"{lat['p99'] * 1000:.0f} ms, max {lat['max'] * 1000:.0f} ms (n={lat['n']})"
        )
        for label, span in r["phases"].items():
            self.say(
                f"    {label:<28} mean {span['mean'] * 1000:7.1f} ms  p50 "
                f"{span['p50'] * 1000:7.1f}  p99 {span['p99'] * 1000:7.1f}"
            )
        hops = ", ".join(f"{t} {v['messages'] / calls:.2f}" for t, v in sorted(r["outbox"].items()))
        self.say(
            f"  outbox messages/call (verify's is a safety net: it runs in the dispatch task): "
            f"{hops}; events/call "
            f"{sum(r['events'].values()) / calls:.1f}; attempts/call {r['attempts'] / calls:.2f}"
        )
        self.say(
            f"  database per call (server, pg_stat_database of {self.bench_db}, waiting loop's "
            f"and ANALYZE's {r['monitor_statements']} statements taken out; "
            f"{describe_analyze(r.get('analyzed'))}):"
        )
        self.say(pgreport.database_line(db, commits, calls))
        self.say(
            f"    statements issued by the proposals (client side): "
            f"{r['propose_statements'] / calls:.1f}/call"
        )
        self.say(pgreport.table_line(tables_before, tables_after, calls))
        machine = cpu.pop("machine")
        self.cpu_per_call = {name: seconds * 1000 / calls for name, seconds in cpu.items()}
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in self.cpu_per_call.items())
        ours = sum(self.cpu_per_call.values())
        cores = os.cpu_count() or 1
        self.say(
            f"  CPU ms/call per process: {parts} (postgres: the {r['backends']} backends of "
            f"{self.bench_db} only, from /proc; redis: the whole server, other clients included)"
        )
        self.say(
            f"    total {ours:.2f} ms/call -> CPU-bound ceiling ~{cores * 1000 / ours:.0f} calls/s "
            f"on {cores} idle cores; whole machine was busy {machine * 1000 / calls:.1f} "
            f"ms/call, load average {self.load[0]:.1f} before / {os.getloadavg()[0]:.1f} after"
        )
        self.say("  worker memory (peak, process tree = main + pool children, every 0.5 s):")
        for name, peak in self.sampler.peak.items():
            self.say(
                f"    {name}: RSS {peak['rss_kib'] / 1024:.0f} MB (PSS {peak['pss_kib'] / 1024:.0f}"
                f" MB) over {peak['processes']} processes"
            )
        self.say(
            f"  invariant: sandbox ledger effects {len(effects)} (distinct request ids "
            f"{len(request_ids)}) == calls {calls}: {'OK' if invariant else 'VIOLATED'}"
        )
        return invariant and complete

    # long: run the baseline, then print its figures beside ours, one block
    def baseline(self, sandbox_url: str, tmp: Path, ours: float, our_cpu: dict) -> None:
        opts = self.options
        self.say(
            f"\nDBOS Transact baseline ({self.dbos_db}): {opts['calls']} three-step workflows on "
            f"{opts['baseline_threads']} threads, steps: {opts['baseline_steps']}"
        )
        try:
            import dbos  # noqa: F401
        except ImportError as exc:
            self.say(
                f"  not run: the dbos package cannot be imported ({exc}); "
                ".venv/bin/pip install -r requirements-bench.txt"
            )
            return
        own_database(self.dbos_url, self.dbos_db, self.options["recreate"])
        out = tmp / "dbos.json"
        argv = [sys.executable, "-m", "bench.dbos_baseline", "--database-url", self.dbos_url]
        argv += ["--workflows", str(opts["calls"]), "--threads", str(opts["baseline_threads"])]
        argv += ["--steps", opts["baseline_steps"], "--sandbox-url", sandbox_url]
        argv += ["--first-order", str(FIRST_ORDER), "--sandbox-pid", str(self.sandbox.pid)]
        argv += ["--out", str(out)]
        try:
            done = subprocess.run(
                argv,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=self.remaining("DBOS baseline"),
            )
        except subprocess.TimeoutExpired:
            self.say("  not run to the end: --timeout reached during the baseline")
            return
        if done.returncode or not out.exists():
            self.say(f"  failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            return
        b = json.loads(out.read_text())
        db, n = b["db"], b["workflows"]
        self.say(
            f"  {b['workflows_per_second']:.1f} workflows/s ({b['succeeded']}/{n} "
            f"ok in {b['seconds']:.2f} s); per workflow (DBOS's pollers included): commits "
            f"{db['xact_commit'] / n:.2f}, rows inserted "
            f"{db['tup_inserted'] / n:.2f}, updated "
            f"{db['tup_updated'] / n:.2f}; process peak RSS "
            f"{b['peak_rss_kib'] / 1024:.0f} MB"
        )
        theirs = {name: seconds * 1000 / n for name, seconds in b["cpu"].items()}
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in theirs.items())
        self.say(
            f"  CPU ms/workflow per process: {parts} (postgres: the {b['backends']} backends of "
            f"{self.dbos_db} only) -> total {sum(theirs.values()):.2f}"
        )
        self.say(f"  maintenance: {describe_analyze(b.get('analyzed'))}")
        effects = ledger(sandbox_url)
        request_ids = {e["request_id"] for e in effects}
        ok = len(effects) == n and len(request_ids) == n
        self.say(
            f"  invariant: sandbox ledger effects {len(effects)} (distinct request ids "
            f"{len(request_ids)}) == workflows {n}: {'OK' if ok else 'VIOLATED'}"
        )
        ratio = ours / b["workflows_per_second"] if b["workflows_per_second"] else float("nan")
        self.say(f"  ratio (our calls/s / DBOS workflows/s, same run): {ratio:.2f}")
        if our_cpu and theirs:
            self.say(
                f"  CPU per call / per workflow: {sum(our_cpu.values()):.2f} / "
                f"{sum(theirs.values()):.2f} ms = "
                f"{sum(our_cpu.values()) / sum(theirs.values()):.2f}"
            )
