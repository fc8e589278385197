"""Server time, queries and size of each console page, measured in-process with Django's test
client against whatever the database holds (`bench_pages` seeds it first).

Wall time per request is the figure here: the client calls the whole Django stack (middleware,
view, queries, template) in this process, with no network, so the time is the server's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.models import Approval
from approvals.selectors import inbox_state
from console.audit import cursor_of
from runs.models import Event, Run, Tenant, User
from toolcalls.models import E, ToolCall


@dataclass
class Page:
    name: str
    path: str
    htmx: bool = False
    # A streamed page: time to its first chunk (the whole export is not the point).
    first_chunk: bool = False


@dataclass
class Figures:
    name: str
    path: str
    status: int
    p50_ms: float
    p95_ms: float
    queries: int
    kib: float
    # This process's CPU per request (not PostgreSQL's): on a busy machine, wall time also
    # counts the wait for a core.
    cpu_p50_ms: float


def pages_of(tenant: Tenant) -> list[Page]:
    """The pages a person of `tenant` opens, with ids picked from its data."""
    approval = (
        Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING)
        .order_by("expires_at")
        .first()
    )
    busiest = Run.objects.filter(tenant=tenant, title="Refunds and notices").order_by("-id").first()
    unknown = (
        ToolCall.objects.filter(tenant=tenant, execution_status=E.RESULT_UNKNOWN)
        .order_by("-id")
        .first()
    )
    last_seq = Event.objects.filter(run=busiest).order_by("-seq").values("seq").first() or {}
    pages = [
        Page("inbox", "/approvals/"),
        Page("inbox poll", "/approvals/", htmx=True),
        Page("inbox poll, unchanged", f"/approvals/?seen={_inbox_seen(tenant)}", htmx=True),
        Page("approval page", f"/approvals/{approval.pk}/" if approval else "/approvals/"),
        Page("runs list", "/runs/"),
        Page("run page", f"/runs/{busiest.pk}/"),
        Page(
            "run page poll, unchanged", f"/runs/{busiest.pk}/?seen={last_seq.get('seq', 0)}", True
        ),
        Page("desk", "/desk/"),
        Page("desk item", f"/desk/{unknown.pk}/" if unknown else "/desk/"),
        Page("audit", "/audit/"),
        Page("audit, older page", "/audit/?before=" + _audit_cursor(tenant)),
        Page("audit by person", f"/audit/?person={_person(tenant)}"),
        Page("audit by id", f"/audit/?q={busiest.pk}"),
        Page("audit export, first line", "/audit/export/", first_chunk=True),
        Page("dashboard", "/dashboard/"),
        Page("/metrics", "/metrics"),
    ]
    return pages


def _inbox_seen(tenant: Tenant) -> str:

    return inbox_state(tenant=tenant).token(timezone.now())


def _person(tenant: Tenant) -> str:
    return User.objects.filter(tenant=tenant, username__startswith="alice").first().username


def _audit_cursor(tenant: Tenant) -> str:
    """The cursor of the 5th page of the tenant's audit trail (see console/audit.py)."""
    event = Event.objects.filter(tenant=tenant).order_by("-occurred_at", "-run_id", "-seq")[400]
    return quote(cursor_of(event))


def measure(page: Page, client: Client, repeat: int) -> Figures:
    headers = {"HX-Request": "true"} if page.htmx else {}
    response = client.get(page.path, headers=headers)  # warm: templates, plans, caches
    queries: list[str] = []

    def count(execute, sql, params, many, context):  # every statement, whatever DEBUG says
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        response = client.get(page.path, headers=headers)
    if response.status_code not in (200, 204):
        raise RuntimeError(f"{page.path} answered {response.status_code}, not a page")
    if page.first_chunk:
        size = len(next(iter(response.streaming_content)))
        response.close()
    else:
        size = len(b"".join(response)) if response.streaming else len(response.content)
    timings, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        answer = client.get(page.path, headers=headers)
        if page.first_chunk:
            next(iter(answer.streaming_content))
            answer.close()
        elif answer.streaming:
            b"".join(answer)
        timings.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    timings.sort()
    return Figures(
        page.name,
        page.path,
        response.status_code,
        statistics.median(timings),
        timings[max(0, round(0.95 * len(timings)) - 1)],
        len(queries),
        size / 1024,
        statistics.median(cpu),
    )


def measure_all(user: User, repeat: int, echo: Callable[[str], None]) -> list[Figures]:
    client = Client()
    client.force_login(user)
    results = []
    echo(
        f"{'page':28} {'status':>6} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8} {'KiB':>8}"
        f" {'cpu p50':>8}"
    )
    for page in pages_of(user.tenant):
        figures = measure(page, client, repeat)
        results.append(figures)
        echo(
            f"{figures.name:28} {figures.status:>6} {figures.p50_ms:>8.1f} "
            f"{figures.p95_ms:>8.1f} {figures.queries:>8} {figures.kib:>8.1f}"
            f" {figures.cpu_p50_ms:>8.1f}"
        )
    return results
