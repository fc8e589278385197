"""Helpers of `python manage.py bench_dispatch` (processes, PostgreSQL statistics, DBOS)."""

# Redis key where benchmark workers add up the SQL statements they send (bench/counting.py).
WORKER_STATEMENTS = "bench:worker_statements"
# Redis hash where they count the Celery tasks they run, by task name: messages per call.
WORKER_TASKS = "bench:worker_tasks"
