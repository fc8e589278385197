"""gunicorn's settings (`gunicorn -c config/gunicorn.py config.wsgi`, as the Procfile runs it):
its own lines — start, workers, errors and the access log — are JSON lines like the
application's (config/logs.py), the access line with the ids of the request it ends."""

from __future__ import annotations

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
