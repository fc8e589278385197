"""Helpers of `python manage.py bench_dispatch` (processes, PostgreSQL statistics, DBOS)."""

# Redis key where benchmark workers add up the SQL statements they send (bench/counting.py).
WORKER_STATEMENTS = "bench:worker_statements"
# Redis hash where they count the Celery tasks they run, by task name: messages per call.
WORKER_TASKS = "bench:worker_tasks"
# Redis hash where they count the outbox drainer's hand-overs: "<task> batches" and "<task>
# rows" for each batched task, so calls per drained batch is printed.
WORKER_DRAINED = "bench:worker_drained"


def drained_line(counts: dict[bytes, bytes]) -> str:
    """Calls per drained batch: what a call's CPU in the workers falls with."""
    drained = {key.decode(): int(n) for key, n in counts.items()}
    batches = drained.get("toolcalls.dispatch batches", 0)
    rows = drained.get("toolcalls.dispatch rows", 0)
    per_batch = f"{rows / batches:.1f}" if batches else "-"
    return (
        f"  drained batches of toolcalls.dispatch: {batches}, calls per drained batch {per_batch}"
    )
