"""PostgreSQL's own time for each console page (`bench_pages --explain`): every statement a
page sends, run again under EXPLAIN (ANALYZE, BUFFERS), and its execution time summed.

On a shared machine the wall time of a page is mostly the wait for a core; the executor's
time of its statements holds better. Each statement is explained `tries` times and the
fastest kept (the first may read from disk, the page's own request warmed nothing here).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection
from django.test import Client

from bench.pages_measure import pages_of
from runs.models import User


@dataclass
class Statement:
    sql: str
    execution_ms: float
    planning_ms: float
    plan: str


def statements_of(client: Client, path: str, headers: dict[str, str], first_chunk: bool):
    sent: list[tuple[str, tuple]] = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        response = client.get(path, headers=headers)
        if first_chunk:
            next(iter(response.streaming_content))
            response.close()
    return sent


def explain(sql: str, params: tuple, tries: int) -> Statement:
    if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
        return Statement(sql, 0.0, 0.0, "")  # writes (a session's last login) are not read
    best = None
    with connection.cursor() as cursor:
        for _ in range(tries):
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            (found,) = cursor.fetchone()
            found = (json.loads(found) if isinstance(found, str) else found)[0]
            if best is None or found["Execution Time"] < best["Execution Time"]:
                best = found
    return Statement(sql, best["Execution Time"], best["Planning Time"], _text(best["Plan"]))


def _text(node: dict, depth: int = 0) -> str:
    """The plan's nodes, one a line: type, index, rows and time (enough to see a sort)."""
    name = node["Node Type"] + (f" using {node['Index Name']}" if "Index Name" in node else "")
    line = (
        f"{'  ' * depth}{name} rows={node.get('Actual Rows')} "
        f"time={node.get('Actual Total Time')} ms"
    )
    return "\n".join([line, *(_text(child, depth + 1) for child in node.get("Plans", []))])


def explain_all(user: User, echo: Callable[[str], None], tries: int = 3, plans: bool = False):
    client = Client()
    client.force_login(user)
    echo(f"{'page':28} {'queries':>8} {'exec ms':>8} {'plan ms':>8}  slowest statement")
    for page in pages_of(user.tenant):
        headers = {"HX-Request": "true"} if page.htmx else {}
        client.get(page.path, headers=headers)  # warm, as bench_pages does
        sent = statements_of(client, page.path, headers, page.first_chunk)
        found = [explain(sql, params, tries) for sql, params in sent]
        slowest = max(found, key=lambda statement: statement.execution_ms)
        echo(
            f"{page.name:28} {len(found):>8} {sum(s.execution_ms for s in found):>8.2f} "
            f"{sum(s.planning_ms for s in found):>8.2f}  {slowest.execution_ms:.2f} ms: "
            f"{slowest.sql[:90]}"
        )
        if plans and slowest.execution_ms >= 1.0:
            echo("\n".join("    " + line for line in slowest.plan.splitlines()))
