"""Helpers of `python manage.py bench_dispatch` (processes, PostgreSQL statistics, DBOS)."""

# Redis key where benchmark workers add up the SQL statements they send (bench/counting.py).
WORKER_STATEMENTS = "bench:worker_statements"
