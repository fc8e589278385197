"""The navigation's URLs (base.html's `{% nav_url %}`) are what `{% url %}` wrote, under any
script prefix: each is reversed once per URL configuration and prefix, not once per page."""

from __future__ import annotations

import re

import pytest
from django.template import Context, Engine
from django.urls import get_script_prefix, reverse, set_script_prefix

from console.templatetags.console_format import nav_url

NAMES = ["runs:list", "approvals:inbox", "policies:list", "desk:list", "ops:dashboard",
         "ops:audit", "people:list", "ops:webhooks", "ops:channels", "logout"]  # fmt: skip


@pytest.fixture
def prefix():
    before = get_script_prefix()
    yield set_script_prefix
    set_script_prefix(before)


def test_each_is_what_the_url_tag_writes(prefix) -> None:
    engine = Engine.get_default()
    for script_prefix in ("/", "/countersign/", "/", "/a&b/"):
        prefix(script_prefix)
        for name in NAMES:
            theirs = engine.from_string(f"{{% url '{name}' %}}").render(Context())
            ours = engine.from_string(
                f"{{% load console_format %}}{{% nav_url '{name}' %}}"
            ).render(Context())
            assert ours == theirs == reverse(name).replace("&", "&amp;")
            assert nav_url(name) == reverse(name)
    prefix("/countersign/")
    assert nav_url("runs:list") == "/countersign/runs/"


def test_the_navigation_links_to_every_page(admin_user) -> None:
    from tests.helpers import logged_in

    page = logged_in(admin_user).get("/runs/").content.decode()
    nav = page.split("<nav>")[1].split("</nav>")[0]
    assert re.findall(r'href="([^"]+)"', nav) == [reverse(name) for name in NAMES[:-1]]
    assert f'action="{reverse("logout")}"' in page
