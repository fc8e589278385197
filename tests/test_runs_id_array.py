"""runs/lookups.py `id_array`: a list of ids as PostgreSQL's array literal, read by the
database as the list itself; any list the literal would have to quote goes as the list."""

from __future__ import annotations

import cProfile
import pstats

import pytest
from django.db import connection, transaction

from runs.lookups import id_array
from runs.models import Run
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls import sql

pytestmark = pytest.mark.django_db

ODD = [
    ["a,b"],  # one id with a comma: the literal would read two
    ["a", ""],
    ["NULL"],
    ["x", "null"],
    ['q"uote'],
    ["sp ace"],
    ["{brace}"],
    ["back\\slash"],
    ["é"],
]


@pytest.mark.parametrize(
    "ids",
    [[], ["tc_01M8TSZN3CXGW4GFME5K8NT5RH"], ["run_A", "run-b", "obx_9"], ["nullable", "Null_1"]],
)
def test_plain_ids_are_a_literal_the_database_reads_as_the_list(ids: list[str]) -> None:
    literal = id_array(ids)
    assert literal == "{" + ",".join(ids) + "}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::varchar[], %s::varchar[]", [literal, ids])
        from_literal, from_list = cursor.fetchone()
    assert from_literal == from_list == ids


@pytest.mark.parametrize("ids", ODD)
def test_any_other_list_goes_as_the_list(ids: list[str]) -> None:
    assert id_array(ids) == ids
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::varchar[]", [id_array(ids)])
        assert cursor.fetchone()[0] == ids


def test_integers_go_as_the_list() -> None:
    assert id_array([1, 2]) == [1, 2]


def test_the_batch_lock_sends_its_ids_without_psycopgs_list_dumper(
    run: Run, sandbox: Sandbox
) -> None:
    calls = [propose_in(run, intent=f"ids-{n}") for n in range(3)]
    profile = cProfile.Profile()
    with transaction.atomic():
        locked = profile.runcall(sql.lock_calls, [call.pk for call in calls], skip_locked=True)
    assert sorted(call.pk for call in locked) == sorted(call.pk for call in calls)
    names = {name for (_, _, name) in pstats.Stats(profile).stats}  # type: ignore[attr-defined]
    assert "_dump_list" not in names
