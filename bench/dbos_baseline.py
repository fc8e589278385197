"""Baseline: DBOS Transact running three-step workflows on PostgreSQL.

    python -m bench.dbos_baseline \
        --database-url postgres://postgres@127.0.0.1:5432/countersign_bench_dbos \
        --workflows 2000 --threads 8 --sandbox-url http://127.0.0.1:8701 --out result.json \
        [--first-order 100000 --sandbox-pid PID]

Each workflow has three @DBOS.step functions. With `--steps http` (the default) they do the
external work of one Countersign tool call against the same sandbox: read the order (the
business check), POST a 1-cent refund with an idempotency key (the dispatch) and read the
order again to find the refund (the verification); workflow i works on order
`--first-order` + i (the caller adds them to the sandbox), so no answer grows as it runs.
`--steps trivial` makes them return at once.
Workflows run synchronously on `--threads` threads; the clock runs from the first start to the
last finish. Started as its own process so that DBOS's globals never meet Django's. The CPU
of this process (all its threads), of the PostgreSQL backends of its database (bench/cpu.py)
and of the sandbox (`--sandbox-pid`) is measured over the same span. When the server's
autovacuum is off, its VACUUM and ANALYZE rules are applied to this database as to
Countersign's (`bench/analyze.py`), and their backend's CPU is DBOS's.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench import pgstats
from bench.analyze import AutoAnalyze
from bench.cpu import BackendCpu
from bench.procs import tree_cpu

TOKEN = {"Authorization": "Bearer dev-payments-key"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dbos_baseline")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--steps", choices=["http", "trivial"], default="http")
    parser.add_argument("--sandbox-url", default="")
    parser.add_argument("--first-order", type=int, default=100_000)
    parser.add_argument("--sandbox-pid", type=int, help="count this process's CPU too")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.steps == "http" and not args.sandbox_url:
        parser.error("--steps http needs --sandbox-url")

    from dbos import DBOS, DBOSConfig  # imported here: a missing package is reported by caller

    logging.getLogger("dbos").setLevel(logging.WARNING)
    payments = f"{args.sandbox_url.rstrip('/')}/payments"
    client = httpx.Client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))
    tag = uuid.uuid4().hex[:8]

    @DBOS.step()
    def check_order(order_id: str) -> int:
        if args.steps == "trivial":
            return 1
        response = client.get(f"{payments}/orders/{order_id}", headers=TOKEN, timeout=5)
        response.raise_for_status()
        return response.json()["refundable_cents"]

    @DBOS.step()
    def send_refund(order_id: str, key: str) -> str:
        if args.steps == "trivial":
            return key
        response = client.post(
            f"{payments}/refunds",
            json={"order_id": order_id, "amount_cents": 1, "currency": "USD", "reason": "dbos"},
            headers={**TOKEN, "X-Request-Id": f"req_{key}", "Idempotency-Key": key},
            timeout=5,
        )
        response.raise_for_status()
        return response.json()["refund_id"]

    @DBOS.step()
    def verify_refund(order_id: str, refund_id: str) -> bool:
        if args.steps == "trivial":
            return True
        response = client.get(f"{payments}/orders/{order_id}", headers=TOKEN, timeout=5)
        response.raise_for_status()
        return any(r["refund_id"] == refund_id for r in response.json()["refunds"])

    @DBOS.workflow()
    def refund_workflow(index: int) -> bool:
        order_id = f"order-{args.first_order + index}"
        if check_order(order_id) < 1:
            return False
        refund_id = send_refund(order_id, f"dbos-{tag}-{index}")
        return verify_refund(order_id, refund_id)

    config: DBOSConfig = {
        "name": "countersign-bench",
        "system_database_url": pgstats.with_database(
            args.database_url, pgstats.database_name(args.database_url), scheme="postgresql"
        ),
        "sys_db_pool_size": args.threads + 4,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        name = pgstats.database_name(args.database_url)
        before = pgstats.database_counters(args.database_url, name)
        backends = BackendCpu(args.database_url, name)
        backends.start()
        # The same VACUUM/ANALYZE pass ours gets (bench/analyze.py), on a backend of this
        # database, so its CPU is DBOS's as autovacuum's would be.
        analyzer = AutoAnalyze(pgstats.conninfo(args.database_url))
        analyzer.start()
        sandbox_before = tree_cpu(args.sandbox_pid) if args.sandbox_pid else 0.0
        started, cpu_started = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(args.threads, thread_name_prefix="dbos") as pool:
            outcomes = list(pool.map(refund_workflow, range(args.workflows)))
        elapsed = time.perf_counter() - started
        cpu = {"dbos process": time.process_time() - cpu_started}
        analyzer.stop()
        cpu["postgres"] = backends.stop()
        if args.sandbox_pid:
            cpu["sandbox"] = tree_cpu(args.sandbox_pid) - sandbox_before
    finally:
        DBOS.destroy(destroy_registry=True)
    time.sleep(1.0)  # backends that closed flush their statistics on exit
    after = pgstats.database_counters(args.database_url, name)
    result = {
        "workflows": args.workflows,
        "threads": args.threads,
        "steps": args.steps,
        "succeeded": sum(1 for ok in outcomes if ok),
        "seconds": elapsed,
        "workflows_per_second": args.workflows / elapsed,
        "db": pgstats.delta(after, before),
        "cpu": cpu,
        "backends": backends.backends_seen,
        "analyzed": dict(analyzer.analyzed) if analyzer.off else None,
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
