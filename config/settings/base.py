"""Settings for every environment, read from the environment.

With no configuration this is the embedded default: SQLite in var/, Celery on the in-memory
broker with an in-process worker (started by `manage.py demo`). Set DATABASE_URL and
CELERY_BROKER_URL for PostgreSQL and Redis; production.py adds the security hardening.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("COUNTERSIGN_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _secret_key() -> str:
    # A key generated once and kept in var/ lets a single host run without configuring one;
    # several hosts must share DJANGO_SECRET_KEY.
    if key := os.environ.get("DJANGO_SECRET_KEY"):
        return key
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(64))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "ninja",
    "axes",
    # Layers, each importing only those above it in this list: runs ← approvals ← toolcalls
    # ← memory ← console (pages). bench holds the benchmark commands.
    "runs",
    "approvals",
    "toolcalls",
    "memory",
    "console",
    "bench",
]

MIDDLEWARE = [
    # First, so that every log line of a request carries the ids it binds (runs/logcontext.py).
    "runs.logcontext.LogContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    # Django's, with the person read in the session's statement (runs/backends.py).
    "runs.backends.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a lockout into a response.
    "axes.middleware.AxesMiddleware",
]

# Django's database sessions in a table that also names the person, read with the person in one
# written-out statement (runs/sessions.py): every console request reads one.
SESSION_ENGINE = "runs.sessions"

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "approvals.context_processors.pending_approvals",
            ],
        },
    },
]

# PostgreSQL session limits for web and worker connections: a process that stalls inside a
# transaction (a worker stopped mid-claim, a swap storm) must not hold its row locks for
# long. Values are PostgreSQL durations ("5s", "500ms", "1min"); "0" turns a limit off; an
# empty value leaves it to the server (e.g. `ALTER ROLE … SET` behind PgBouncer, which does
# not pass startup options on).
DATABASE_SESSION_LIMITS = {
    # A request or task waiting this long for a row lock gives up (the API answers 503
    # database.busy) instead of queueing behind a stalled holder.
    "lock_timeout": os.environ.get("DATABASE_LOCK_TIMEOUT", "5s"),
    # The server ends a session idle inside a transaction this long, releasing its locks:
    # no transaction here waits on anything but the database (no I/O is done inside one).
    "idle_in_transaction_session_timeout": os.environ.get(
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT", "10s"
    ),
    # No statement of a request or task runs this long; gunicorn's own timeout is 30 s.
    "statement_timeout": os.environ.get("DATABASE_STATEMENT_TIMEOUT", "30s"),
}


def postgres_session_options(limits: dict[str, str]) -> str:
    """libpq `options` setting each limit at connection start (`-c lock_timeout=5s …`)."""
    options = []
    for name, value in limits.items():
        value = value.strip()
        if not value:
            continue
        if not re.fullmatch(r"\d+(us|ms|s|min|h|d)?", value):
            raise ImproperlyConfigured(
                f"{name} must be a PostgreSQL duration such as 5s, 500ms or 1min, not {value!r}"
            )
        options.append(f"-c {name}={value}")
    return " ".join(options)


DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {
        "default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
    }
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    if env_bool("DATABASE_PREPARED_STATEMENTS", True):
        # Server-side binding lets psycopg prepare a statement after its fifth run on a
        # connection, so PostgreSQL stops parsing and planning the same few queries of every
        # tool call again (bench_dispatch). Turn it off behind a transaction-mode pooler
        # (PgBouncer before 1.21), which cannot keep prepared statements per connection.
        _options.update(server_side_binding=True, prepare_threshold=5)
    if _session := postgres_session_options(DATABASE_SESSION_LIMITS):
        # After any `options` given in DATABASE_URL, so these win.
        _options["options"] = " ".join(filter(None, [_options.get("options", ""), _session]))
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "countersign.sqlite3",
            "OPTIONS": {
                # Worker threads and web requests write at once: take the write lock at BEGIN
                # and wait for it, instead of failing with "database is locked" mid-transaction.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
    # The covering indexes' INCLUDE columns are PostgreSQL's; SQLite builds the same indexes
    # without them, which is all the embedded demo needs: no warning at every migrate.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "runs.User"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Django's ModelBackend, reading the tenant with the person (runs/backends.py).
    "runs.backends.PersonBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
# The start page sends each person where their work is (console/views/home.py).
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Repeated failed logins lock one username from one client address, for AXES_COOLOFF_HOURS.
# Not the username alone (anyone could lock a person out) nor the address alone (behind a
# proxy every person shares it): the pair.
AXES_FAILURE_LIMIT = int(os.environ.get("AXES_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = float(os.environ.get("AXES_COOLOFF_HOURS", "0.25"))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# How many proxies in front of gunicorn append to X-Forwarded-For: the client's address is
# that many entries from the right. 0 ignores the header (a client could write anything).
TRUSTED_PROXY_COUNT = int(os.environ.get("TRUSTED_PROXY_COUNT", "0"))
AXES_CLIENT_IP_CALLABLE = "config.client_ip.client_ip"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the app folders, so the embedded default needs no collectstatic.
WHITENOISE_USE_FINDERS = True

# The agent API refuses bodies larger than this with 413 before parsing them.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("API_MAX_BODY_BYTES", str(256 * 1024)))

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "countersign@localhost")
COUNTERSIGN_BASE_URL = os.environ.get("COUNTERSIGN_BASE_URL", "http://127.0.0.1:8000")

# Run memory (memory/). A checkpoint keeps where an agent is, not copies of what it read.
CHECKPOINT_MAX_BYTES = int(os.environ.get("CHECKPOINT_MAX_BYTES", str(64 * 1024)))
# The longest life a run-scoped credential may ask for (POST /runs/{id}/credentials, ttl_s);
# it also ends at its minting key's expiry and at the run's end.
RUN_CREDENTIAL_MAX_TTL_SECONDS = int(os.environ.get("RUN_CREDENTIAL_MAX_TTL_SECONDS", "3600"))
# Eval traces leave out events younger than this: a transaction still committing may hold an
# event older than the newest one served, which a reader going on with ?since= would miss.
EVAL_TRACE_SETTLE_SECONDS = float(os.environ.get("EVAL_TRACE_SETTLE_SECONDS", "60"))

# --- Celery -------------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "memory://localhost/")
# True when no broker is configured: the worker and beat run inside the web process.
EMBEDDED = CELERY_BROKER_URL.startswith("memory://")
if CELERY_BROKER_URL.startswith("redis://"):
    # kombu's Redis transport, keeping one client object per channel (config/broker.py): it
    # made one per publish, a third of the approve POST's publish. Not for rediss://: kombu
    # turns TLS on from the URL's scheme only when the transport is named by it.
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
# Results live in the database as events; nothing reads Celery's result backend.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# Ack after the task ran, so a task whose worker died is redelivered; every task is idempotent.
CELERY_TASK_ACKS_LATE = True
# A worker process killed mid-task (OOM, SIGKILL) re-queues the message instead of dropping it.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# One message at a time per process: a prefetched message would wait behind a slow HTTP call.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Redis redelivers an unacked message after this many seconds. It must exceed the longest
# countdown we schedule and the longest task, or a message is delivered twice on purpose.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": int(os.environ.get("CELERY_VISIBILITY_TIMEOUT", "3600")),
    # Workers ask Redis for the queues in the order of CELERY_TASK_QUEUES every time (BRPOP
    # takes the first non-empty list), instead of kombu's default round robin.
    "queue_order_strategy": "priority",
}
# A call a person just approved is dispatched from its own queue, which every worker takes
# from first: an approver's click does not wait behind a backlog of bulk work in `celery`
# (bench_approve measured clicks queued for over 10 s behind 2,000 auto-authorized calls).
# Workers consume every queue listed here unless started with -Q.
CELERY_TASK_QUEUES = (Queue("interactive"), Queue("celery"))
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_ROUTES = {"toolcalls.dispatch_approved": {"queue": "interactive"}}
# A worker started with WORKER_NICE=n runs its tasks n steps below normal CPU priority
# (config/celery_app.py). The Procfile's bulk worker sets 10: when bulk work, the proposer and
# PostgreSQL saturate the cores, the web process and the `interactive` worker are scheduled
# first, so an approver's click does not wait for a core behind bulk work (bench_approve).
WORKER_NICE = int(os.environ.get("WORKER_NICE", "0"))
# A task that hangs is killed; its lease expires and the sweeper turns the call into unknown.
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Publishing does not retry: an unpublished message stays in the outbox and the sweeper sends
# it, instead of a web request hanging on a broker that is down.
CELERY_TASK_PUBLISH_RETRY = False

# Bearer token for a Prometheus scraper to read /metrics of every tenant; empty: admins only.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")

# --- Event log ------------------------------------------------------------------------------
# Only test settings turn this on: `flush` may then empty the append-only event table.
EVENT_LOG_ALLOW_FLUSH = False

# One JSON object per line (LOG_FORMAT=json) for web, worker and beat, with the ids of the
# request or task (tenant, run, tool call, approval, correlation) and, when tracing is on,
# its trace and span ids (config/logs.py); LOG_FORMAT=text writes the same as text.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "json")
if LOG_FORMAT not in {"json", "text"}:
    raise ImproperlyConfigured(f"LOG_FORMAT is json or text, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"ids": {"()": "config.logs.IdsFilter"}},
    "formatters": {
        "json": {"()": "config.logs.JsonFormatter"},
        "text": {"()": "config.logs.TextFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["ids"]}
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.server": {"level": "WARNING"},
        "celery": {"level": os.environ.get("CELERY_LOG_LEVEL", "INFO")},
        "axes": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}

# --- Connectors to external systems -----------------------------------------------------------
# The simulated external systems (`manage.py sandbox`); tenants without connectors use them.
SANDBOX_URL = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8700")


def _connectors() -> dict:
    # {"tenant-slug": {"payments": {"base_url": "...", "token": "..."}, ...}}, kept out of the
    # database and the code: a JSON file named by COUNTERSIGN_CONNECTORS_FILE.
    path = os.environ.get("COUNTERSIGN_CONNECTORS_FILE")
    return json.loads(Path(path).read_text()) if path else {}


COUNTERSIGN_CONNECTORS = _connectors()
# Tests shorten the external calls' timeouts with this (seconds); None keeps each
# capability's own.
TOOLCALL_TIMEOUT_OVERRIDE = float(os.environ.get("TOOLCALL_TIMEOUT_OVERRIDE", "0")) or None
# How long an open circuit breaker stops a capability before one probe call passes.
CIRCUIT_OPEN_SECONDS = float(os.environ.get("CIRCUIT_OPEN_SECONDS", "30"))
# Extra time past a call's own timeout before the sweeper deems its worker gone.
LEASE_MARGIN_SECONDS = float(os.environ.get("LEASE_MARGIN_SECONDS", "10"))
# Batched dispatch (toolcalls/dispatch_batch.py; a batch is the `toolcalls.dispatch` rows one
# outbox lease holds, OUTBOX_DRAIN_BATCH below): how many requests of a batch are in flight at
# once (threads per worker process). Enough for the rate times the external system's answer
# time; a thread more is one more that waits for the cores when answers come fast.
DISPATCH_SEND_THREADS = int(os.environ.get("DISPATCH_SEND_THREADS", "16"))
# An outbox message still undone this long after it was due is published again.
OUTBOX_REPUBLISH_AFTER_SECONDS = float(os.environ.get("OUTBOX_REPUBLISH_AFTER_SECONDS", "30"))
# A message republished by the sweeper goes to the queue named here for its task instead of
# its route: an approved call's dispatch nobody took from `interactive` within the delay above
# (no `interactive` worker running, or it is down) is taken by the bulk workers (-Q celery).
OUTBOX_REPUBLISH_QUEUES = {"toolcalls.dispatch_approved": "celery"}
# After this many republishes a message is left undone and no longer sent: its task keeps
# failing, and `manage.py outbox_stuck` lists it for a person (who can --requeue it).
OUTBOX_MAX_REPUBLISHES = int(os.environ.get("OUTBOX_MAX_REPUBLISHES", "20"))
# The outbox drainer (runs/drain.py): rows it leases per statement (a full lease wakes a peer
# drainer); how long a lease keeps them from other drainers (a dead drainer's rows come back
# after it; longer than a batch takes); how long one drain task goes on before it hands over
# to a fresh one — short, because a worker process busy draining is one that an approver's
# click (the `interactive` queue) waits for; and the wake-up flag's life, which bounds what a
# lost wake-up costs.
OUTBOX_DRAIN_BATCH = int(os.environ.get("OUTBOX_DRAIN_BATCH", "40"))
OUTBOX_DRAIN_LEASE_SECONDS = float(os.environ.get("OUTBOX_DRAIN_LEASE_SECONDS", "30"))
OUTBOX_DRAIN_MAX_SECONDS = float(os.environ.get("OUTBOX_DRAIN_MAX_SECONDS", "2"))
OUTBOX_WAKE_TTL_SECONDS = int(os.environ.get("OUTBOX_WAKE_TTL_SECONDS", "5"))
# A drainer whose lease came back short but with more than one row (a burst, or a steady
# arrival) waits for more, at the rate they came, until the batch would hold
# OUTBOX_DRAIN_FILL_TARGET rows but never longer than OUTBOX_DRAIN_FILL_MS (0: never waits).
# A lone row never waits. 40 and 32 (was 20 and 16): bench_dispatch's batches 6.3 -> 9.8-13.5
# calls, CPU per call 11.14 -> 9.33-10.26 ms, proposal -> accepted at 60 calls/s unchanged
# (p99 112 -> 123 ms); docs/performance.md.
OUTBOX_DRAIN_FILL_MS = float(os.environ.get("OUTBOX_DRAIN_FILL_MS", "40"))
OUTBOX_DRAIN_FILL_TARGET = int(os.environ.get("OUTBOX_DRAIN_FILL_TARGET", "32"))
# How often beat sweeps: expired leases, outbox messages nobody took.
SWEEP_INTERVAL_SECONDS = float(os.environ.get("SWEEP_INTERVAL_SECONDS", "10"))
# Webhooks (toolcalls/webhooks.py): how long a receiver may take to answer, how many attempts
# a delivery gets, and the backoff between them (doubling from the base, capped, with jitter).
WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("WEBHOOK_TIMEOUT_SECONDS", "10"))
WEBHOOK_MAX_ATTEMPTS = int(os.environ.get("WEBHOOK_MAX_ATTEMPTS", "8"))
WEBHOOK_RETRY_BASE_SECONDS = float(os.environ.get("WEBHOOK_RETRY_BASE_SECONDS", "10"))
WEBHOOK_RETRY_MAX_SECONDS = float(os.environ.get("WEBHOOK_RETRY_MAX_SECONDS", "3600"))
# How often beat expires due approvals and escalates those close to expiry.
APPROVAL_SWEEP_SECONDS = float(os.environ.get("APPROVAL_SWEEP_SECONDS", "60"))
CELERY_BEAT_SCHEDULE = {
    "expire-approvals": {"task": "approvals.expire", "schedule": APPROVAL_SWEEP_SECONDS},
    "escalate-approvals": {"task": "approvals.escalate", "schedule": APPROVAL_SWEEP_SECONDS},
    "sweep-outbox": {"task": "runs.sweep_outbox", "schedule": SWEEP_INTERVAL_SECONDS},
    "sweep-leases": {"task": "toolcalls.sweep_leases", "schedule": SWEEP_INTERVAL_SECONDS},
    "clear-expired-sessions": {"task": "runs.clear_expired_sessions", "schedule": 3600},
}
