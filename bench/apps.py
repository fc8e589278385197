from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmarks: `manage.py bench_dispatch` and its helpers. No models, no pages."""

    name = "bench"
