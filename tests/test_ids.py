from __future__ import annotations

import re
import time

from runs.ids import new_id


def test_it_prefixes_and_sorts_by_time() -> None:
    first = new_id("run")
    time.sleep(0.002)
    second = new_id("run")
    assert re.fullmatch(r"run_[0-9A-HJKMNP-TV-Z]{26}", first)
    assert first < second


def test_it_never_repeats_within_one_millisecond() -> None:
    ids = {new_id("evt") for _ in range(5000)}
    assert len(ids) == 5000
