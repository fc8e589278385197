from __future__ import annotations

import random
import re
import time

from runs.ids import _characters, new_id


def test_it_prefixes_and_sorts_by_time() -> None:
    first = new_id("run")
    time.sleep(0.002)
    second = new_id("run")
    assert re.fullmatch(r"run_[0-9A-HJKMNP-TV-Z]{26}", first)
    assert first < second


def test_it_never_repeats_within_one_millisecond() -> None:
    ids = {new_id("evt") for _ in range(5000)}
    assert len(ids) == 5000


def _reference(millis: int, random: int) -> str:
    """The characters digit by digit, as ULID defines them (and as new_id once made them)."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = (millis % 2**50) * 2**80 + random
    return "".join(alphabet[(value >> (5 * i)) % 32] for i in reversed(range(26)))


def test_its_characters_are_ulids_digits() -> None:
    rng = random.Random(12)
    cases = [(0, 0), (2**50 - 1, 2**80 - 1), (2**50, 1), (1_764_590_000_000, 2**79)]
    cases += [(rng.getrandbits(50), rng.getrandbits(80)) for _ in range(3000)]
    for millis, bits in cases:
        assert _characters(millis, bits) == _reference(millis, bits)
