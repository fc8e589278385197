"""gunicorn's settings (`gunicorn -c config/gunicorn.py config.wsgi`, as the Procfile runs it):
its own lines — start, workers, errors and the access log — are JSON lines like the
application's (config/logs.py), the access line with the ids of the request it ends.

WEB_NICE: the Procfile's `api` line, which serves the agents, runs this many steps below
normal CPU priority, so that on saturated cores the console's `web` line (the approver's
click) is scheduled first (bench_approve --load dispatch)."""

from __future__ import annotations

import os

accesslog = "-"
_json_lines = {
    "class": "logging.StreamHandler",
    "formatter": "json",
    "filters": ["ids"],
    "stream": "ext://sys.stdout",
}
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"ids": {"()": "config.logs.IdsFilter"}},
    "formatters": {"json": {"()": "config.logs.JsonFormatter"}},
    "handlers": {"json": _json_lines},
    "root": {"level": "INFO", "handlers": ["json"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["json"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["json"], "propagate": False},
    },
}


def on_starting(server: object) -> None:
    # In the master, before any worker is forked: the workers inherit the nice value.
    from config import priority

    priority.lower(int(os.environ.get("WEB_NICE", "0") or 0))
