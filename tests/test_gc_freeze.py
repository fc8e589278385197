"""Long-lived processes freeze what startup loaded (config/gc_freeze.py): a full garbage
collection in the middle of a request walked ~150,000 startup objects (30-90 ms; the one
approve click of 60 over 50 ms in bench_approve)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import signals

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # leave the test process as it was


def test_the_web_process_freezes_what_django_loaded() -> None:
    probe = "import gc, config.wsgi; print(gc.get_freeze_count())"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    # Django, the apps and their modules: well over 50,000 objects no collection walks again.
    assert int(out.stdout.strip()) > 50_000


@pytest.mark.parametrize("signal", [signals.worker_ready, signals.worker_process_init])
def test_a_worker_freezes_when_it_is_ready_and_in_each_pool_child(
    unfrozen: None, signal: signals.Signal
) -> None:
    import config.celery_app  # noqa: F401  (connects the handlers)

    assert gc.get_freeze_count() == 0
    signal.send(sender=None)
    assert gc.get_freeze_count() > 50_000
    gc.collect()
    assert gc.get_freeze_count() > 50_000  # a collection leaves them frozen
