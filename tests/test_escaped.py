"""console/formatting.py `escaped`, which the long lists' rows are written with, escapes as the
template does: every character html.escape and django.utils.html.escape replace, and values
with nothing to escape come back as they are."""

from __future__ import annotations

import pytest
from django.utils.html import escape

from console.formatting import escaped


@pytest.mark.parametrize(
    "value",
    [
        "run_01M8SJKRJ08YMWE6EYES6CZJPZ",
        "",
        "&",
        "<b>",
        'say "no"',
        "o'clock",
        "a & b < c > d \" e ' f",
        "Refunds and notices — 5\xa0minutes",
        42,
        None,
    ],
)
def test_it_escapes_as_the_template_does(value: object) -> None:
    assert escaped(value) == escape(value)
