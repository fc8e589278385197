"""Helpers of `python manage.py bench_dispatch` (processes, PostgreSQL statistics, DBOS)."""
