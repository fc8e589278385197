from __future__ import annotations

import os

import django
from django.core.handlers.wsgi import WSGIHandler

from config import gc_freeze, telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

# What get_wsgi_application() does, with tracing (when OTEL_EXPORTER_OTLP_ENDPOINT is set)
# turned on in between: after setup, so the tasks can be imported, and before the handler
# loads the middleware, so Django's instrumentation is in it.
django.setup(set_prefix=False)
telemetry.configure("web")
application = WSGIHandler()
# What startup loaded stays for the process's life: no full collection walks it again.
gc_freeze.freeze()
