"""Where a console page spends this process's CPU: cProfile over `repeat` requests of one page
of `pages_measure.pages_of`, with the CPU clock (not wall time: the machine is shared)."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

from django.test import Client

from bench.pages_measure import pages_of
from runs.models import User

# The console's views: their callees say what a page's own code costs, beside the template.
_VIEWS = r"run_detail|views/approvals.py.*\(detail\)|_page_context"


def profile_page(user: User, name: str, repeat: int, echo: Callable[[str], None]) -> None:
    pages = {page.name: page for page in pages_of(user.tenant)}
    if name not in pages:
        raise ValueError(f"no page {name!r}; pages: {', '.join(pages)}")
    page = pages[name]
    client = Client()
    client.force_login(user)
    headers = {"HX-Request": "true"} if page.htmx else {}
    client.get(page.path, headers=headers)  # warm: templates, plans, caches
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(repeat):
        client.get(page.path, headers=headers)
    profiler.disable()
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(30)
        if order == "cumulative":
            stats.print_callees(_VIEWS)
        echo(f"--- {name} ({page.path}), {repeat} requests, by {order} (CPU s) ---")
        echo(out.getvalue())
