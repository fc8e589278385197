"""verify_event_chain and rebuild_projections --verify read the log in bounded pieces
(runs/chain_check.py; runs/projections.py, a batch of runs at a time) and still find what
they found before: a tampered event, a row changed behind its events."""

from __future__ import annotations

import gc
import json
import weakref

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import InternalError, connection, transaction

from runs import chain_check, projections, services
from runs.events import verify_chain
from runs.models import Decision, Event, Run, Tenant
from toolcalls.lifecycle import run_finish


def finished_run(tenant: Tenant, title: str, content: dict) -> Run:
    run, _ = services.run_start(tenant=tenant, title=title, actor="test")
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="judgment", content=content, actor="test"
    )
    run_finish(tenant=tenant, run_id=run.pk, actor="test")
    return run


# What the standard library's JSON writes unlike RFC 8785: floats (1.0, 0.1 + 0.2, 5e-324),
# key order past the Basic Multilingual Plane, a string escape or two.
AWKWARD = {
    "whole": 1.0,
    "sum": 0.1 + 0.2,
    "tiny": 5e-324,
    "\U0001f600 emoji": "first in code points, last in UTF-16",
    "\ue000 private": "the other way round",
    "text": 'tab\\t, quote ", backslash \\\\, \\u2028, é',
}


def test_awkward_payloads_verify_through_the_exact_canonicaliser(tenant: Tenant, capsys) -> None:
    runs = [finished_run(tenant, f"run {i}", {**AWKWARD, "i": i}) for i in range(3)]
    call_command("verify_event_chain")
    assert "OK: 9 events" in capsys.readouterr().out
    problems, count = chain_check.verify_log()
    assert (problems, count) == ([], 9)
    assert verify_chain(Event.objects.order_by("run_id", "seq")) == []
    assert all(run.state == "completed" for run in Run.objects.filter(pk__in=[r.pk for r in runs]))


def test_a_tampered_event_is_found_with_the_same_words_as_before(tenant: Tenant) -> None:
    runs = [finished_run(tenant, f"run {i}", {"ok": True, "x": 1.5}) for i in range(3)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
        cursor.execute(
            "UPDATE runs_event SET payload = jsonb_set(payload, '{content,x}', '2.5') "
            "WHERE run_id = %s AND seq = 2",
            [runs[1].pk],
        )
        cursor.execute(
            "UPDATE runs_event SET prev_hash = %s WHERE run_id = %s AND seq = 3",
            ["0" * 64, runs[2].pk],
        )
    problems, _count = chain_check.verify_log()
    assert problems == verify_chain(Event.objects.order_by("run_id", "seq"))
    # The broken link, and the hash it no longer matches (prev_hash is hashed too).
    assert [p.split(" ")[0] for p in problems] == [
        f"{runs[1].pk}#2",
        f"{runs[2].pk}#3",
        f"{runs[2].pk}#3",
    ]
    assert "content does not match its hash" in problems[0]
    assert "prev_hash does not match" in problems[1]
    with pytest.raises(CommandError, match="3 problems in 9 events"):
        call_command("verify_event_chain")


def long_run(tenant: Tenant, title: str, decisions: int) -> Run:
    run, _ = services.run_start(tenant=tenant, title=title, actor="test")
    for i in range(decisions):
        services.decision_record(
            tenant=tenant, run_id=run.pk, kind="judgment", content={"i": i}, actor="test"
        )
    run_finish(tenant=tenant, run_id=run.pk, actor="test")
    return run


def _batches_seen(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    seen: list[list[str]] = []
    compare = projections._compare

    def spy(rebuilt: dict, run_ids: list[str]) -> list[str]:
        seen.append(list(run_ids))
        return compare(rebuilt, run_ids)

    monkeypatch.setattr(projections, "_compare", spy)
    return seen


def test_rebuild_projections_compares_batch_by_batch(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(projections, "EVENTS_PER_BATCH", 6)
    runs = sorted((finished_run(tenant, f"run {i}", {"i": i}) for i in range(5)), key=_pk)
    seen = _batches_seen(monkeypatch)
    call_command("rebuild_projections", "--verify")
    # 3 events a run: a batch closes at the first run boundary past 6 events.
    assert seen == [[runs[0].pk, runs[1].pk], [runs[2].pk, runs[3].pk], [runs[4].pk]]
    Decision.objects.filter(run=runs[2]).update(content={"i": 99})
    Decision.objects.filter(run=runs[4]).update(kind="changed")
    with pytest.raises(CommandError, match="2 differences after replaying 15 events"):
        call_command("rebuild_projections", "--verify")
    out = capsys.readouterr().out
    assert "content stored={'i': 99} rebuilt={'i': 2}" in out
    assert "kind stored='changed' rebuilt='judgment'" in out
    assert "events/s" in out  # the pace is printed with the differences too


def test_a_run_longer_than_a_batch_is_compared_whole(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches are counted in events but close between runs: a run straddling the count is
    replayed to its end before its rows are compared, so a difference in its later events
    (and in its state, set by its last one) is found, and nothing in it is reported twice."""
    monkeypatch.setattr(projections, "EVENTS_PER_BATCH", 4)
    runs = sorted(
        [finished_run(tenant, "short", {"i": 0}), long_run(tenant, "long", decisions=9)],
        key=_pk,
    )
    runs.append(finished_run(tenant, "after", {"i": 1}))  # ids grow: it sorts last
    long = next(run for run in runs if run.title == "long")
    seen = _batches_seen(monkeypatch)
    assert projections.verify_log() == ([], 3 + 11 + 3)
    # 3 events, then 11: the batch passes 4 events inside the long run and closes after it.
    assert seen == [[runs[0].pk, runs[1].pk], [runs[2].pk]]
    last = Event.objects.filter(run=long, event_type="decision.recorded").order_by("-seq")[0]
    Decision.objects.filter(pk=last.decision_id).update(content={"i": -1})
    Run.objects.filter(pk=long.pk).update(state="needs_human")
    problems = projections.verify()
    assert sorted(problems) == sorted(
        [
            f"decision {last.decision_id}: content stored={{'i': -1}} rebuilt={{'i': 8}}",
            f"run {long.pk}: state stored='needs_human' rebuilt='completed'",
            f"eval_trace {long.pk}: exit stored='needs_human' rebuilt='completed'",
        ]
    ), problems


def test_a_run_with_no_event_is_found(tenant: Tenant) -> None:
    run = finished_run(tenant, "logged", {"i": 0})
    Run.objects.create(id=f"{run.pk}X", tenant=tenant, title="never logged")
    problems = projections.verify()
    assert f"run {run.pk}X: in the table but never logged" in problems, problems


def test_the_replay_collects_garbage_by_batch_not_automatically(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No automatic collection walks the batch's rows while they are replayed; what the
    replay leaves in reference cycles is collected when its batch is compared, so memory
    stays bounded by a batch; the collector is on again after the check."""
    monkeypatch.setattr(projections, "EVENTS_PER_BATCH", 3)
    for i in range(3):
        finished_run(tenant, f"run {i}", {"i": i})
    enabled, cycles, alive = [], [], []

    class Node:
        me: object

    def probe(rows: dict, event: object, payload: dict) -> None:
        enabled.append(gc.isenabled())
        node = Node()
        node.me = node  # garbage that reference counts never free
        cycles.append(weakref.ref(node))

    monkeypatch.setitem(
        projections.PROJECTIONS,
        "probe",
        projections.Projection("probe", lambda run_ids: {}, {"decision.recorded": probe}),
    )
    compare = projections._compare

    def compared(rebuilt: dict, run_ids: list[str]) -> list[str]:
        problems = compare(rebuilt, run_ids)
        alive.append(sum(ref() is not None for ref in cycles))
        return problems

    monkeypatch.setattr(projections, "_compare", compared)
    assert gc.isenabled()
    assert projections.verify_log() == ([], 9)
    assert enabled == [False, False, False] and gc.isenabled()
    assert alive == [0, 0, 0] and len(cycles) == 3


def _pk(run: Run) -> str:
    return run.pk


# Integers orjson holds in 64 bits and those it would read as floats, beside AWKWARD's floats.
LONG_NUMBERS = {
    "max_u64": 2**64 - 1,
    "past_u64": 2**64,
    "min_i64": -(2**63),
    "past_i64": -(2**63) - 1,
    "huge": 10**30,
    "in_text": "1234567890123456789012",
}


def test_the_replay_reads_payloads_as_json_loads_does(tenant: Tenant, capsys) -> None:
    # The log itself holds integers up to 2**53 (RFC 8785); the loader is checked past that.
    finished_run(tenant, "numbers", {**AWKWARD, "safe": 2**53 - 1, "text": LONG_NUMBERS["in_text"]})
    call_command("rebuild_projections", "--verify")
    assert "OK: replayed 3 events" in capsys.readouterr().out
    loader = projections._PayloadLoader(0)
    # Each number alone too: -(2**63) - 1 has 19 digits, the shortest orjson reads as a float.
    values = [{**AWKWARD, **LONG_NUMBERS}, LONG_NUMBERS, AWKWARD, [1, 2.5, "x"]]
    values += [{"é": [number]} for number in LONG_NUMBERS.values()]
    for value in values:
        data = json.dumps(value).encode()
        assert loader.load(data) == json.loads(data)
        assert [type(v) for v in _leaves(loader.load(data))] == [
            type(v) for v in _leaves(json.loads(data))
        ]


def _leaves(value: object) -> list:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_a_decision_changed_behind_its_event_is_found_by_the_fast_replay(tenant: Tenant) -> None:
    run = finished_run(tenant, "changed", {"n": 2**53 - 1, "when": "2026-12-01T04:00:00Z"})
    Decision.objects.filter(run=run).update(content={"n": 2**53 - 2, "when": "2026-12-01"})
    problems = projections.verify()
    assert len(problems) == 1 and "content" in problems[0], problems


@pytest.mark.django_db(transaction=True)
def test_a_run_changed_while_the_check_runs_is_not_a_difference(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check reads the log and the rows in one snapshot: a run renamed (committed by
    another connection) after the replay began is compared as it was when it began, and the
    check's own transaction refuses writes."""
    run = finished_run(tenant, "as logged", {"i": 0})
    db = connection.settings_dict
    compare = projections._compare

    def rename_then_compare(rebuilt: dict, run_ids: list[str]) -> list[str]:
        with psycopg.connect(
            host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
        ) as other:
            other.execute("UPDATE runs_run SET title = 'moved on' WHERE id = %s", [run.pk])
        return compare(rebuilt, run_ids)

    monkeypatch.setattr(projections, "_compare", rename_then_compare)
    assert projections.verify() == []
    monkeypatch.setattr(projections, "_compare", compare)
    assert projections.verify() == [f"run {run.pk}: title stored='moved on' rebuilt='as logged'"]

    def write(rebuilt: dict, run_ids: list[str]) -> list[str]:
        Run.objects.filter(pk=run.pk).update(title="written by the check")
        return []

    monkeypatch.setattr(projections, "_compare", write)
    with pytest.raises(InternalError, match="read-only transaction"):
        projections.verify()
