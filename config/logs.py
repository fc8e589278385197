"""Log lines an operator can follow one call through (LOGGING in config/settings/base.py).

`IdsFilter` adds the ids the request or task has bound (runs/logcontext.py) to every record,
and the trace and span ids when tracing is on. `JsonFormatter` writes one JSON object per line
(LOG_FORMAT=json, the default); `TextFormatter` the same facts as text (LOG_FORMAT=text).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from config import telemetry
from runs import logcontext


class IdsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.ids = {**logcontext.bound(), **telemetry.current_trace_ids()}
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            **getattr(record, "ids", {}),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        ids = " ".join(f"{name}={value}" for name, value in getattr(record, "ids", {}).items())
        return f"{super().formatMessage(record)} {ids}".rstrip()
