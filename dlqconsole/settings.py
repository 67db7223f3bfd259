"""Settings for dlqconsole. Every deploy-specific value comes from the environment (see .env.example)."""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP
from kombu import Exchange, Queue

from dlqconsole.checks import DEVELOPMENT_SECRET_KEY
from dlqconsole.core.broker_urls import check_amqp_url
from dlqconsole.core.env import (
    env_bool,
    env_duration,
    env_float,
    env_int,
    env_list,
    env_mapping,
    env_networks,
    env_str,
)
from dlqconsole.core.ratelimit import parse_rate

BROKER_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# Lets admin and querysets be subscripted with their model at run time, as the type checker sees them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("DLQ_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)
# Signs sessions, CSRF tokens and channel tags. Without it, a public development key lets the commands that sign
# nothing run anywhere (migrate, check, collectstatic, `dlq fingerprint`); the web server, the Celery workers and
# beat refuse to start with it unless DEBUG is on, and `check --deploy` reports it (dlqconsole/checks.py, whose
# deploy check importing it here registers).
SECRET_KEY = env_str("SECRET_KEY", "") or DEVELOPMENT_SECRET_KEY
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "dlqconsole.accounts.admin_apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "django_prometheus",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "dlqconsole.accounts",
    "dlqconsole.brokers",
    "dlqconsole.deadletters",
    "dlqconsole.ingest",
    "dlqconsole.operations",
    "dlqconsole.alerts",
    "dlqconsole.api",
    # Last: the console's own config, which wires up what reads every app above (the /metrics collector).
    "dlqconsole.apps.ConsoleConfig",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "dlqconsole.core.middleware.HtmxMessagesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "dlqconsole.urls"
WSGI_APPLICATION = "dlqconsole.wsgi.application"

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
                "dlqconsole.accounts.context_processors.roles",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'dlqconsole.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60, minimum=0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and a busy timeout let the web process, the consumer and the worker share one SQLite file.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # No JIT: the console's queries are index probes that run in a millisecond, but the planner's estimates for
    # some of them (per-moment lateral probes) cross the JIT threshold, and compiling then costs 100+ ms.
    DATABASES["default"].setdefault("OPTIONS", {})
    DATABASES["default"]["OPTIONS"]["options"] = " ".join(
        filter(None, [DATABASES["default"]["OPTIONS"].get("options", ""), "-c jit=off"])
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The sign-in throttle asks first and refuses a locked user name or address; ModelBackend checks passwords; the
# roles answer the Django admin's permission questions (dlqconsole/accounts/admin_site.py).
AUTHENTICATION_BACKENDS = [
    "dlqconsole.accounts.signin.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
    "dlqconsole.accounts.admin_site.RolePermissionBackend",
]
# After this many failed sign-ins within the window, for one user name from one address, from one address (an IPv6
# /64), or for one user name from anywhere, sign-in there is refused for the lockout (see
# dlqconsole/accounts/signin.py), counted in the cache below. The last is high: anyone can fail for any name.
DLQ_LOGIN_FAILURES_PER_NAME_AND_ADDRESS = env_int("DLQ_LOGIN_FAILURES_PER_NAME_AND_ADDRESS", 5, minimum=1)
DLQ_LOGIN_FAILURES_PER_ADDRESS = env_int("DLQ_LOGIN_FAILURES_PER_ADDRESS", 20, minimum=1)
DLQ_LOGIN_FAILURES_PER_NAME = env_int("DLQ_LOGIN_FAILURES_PER_NAME", 100, minimum=1)
DLQ_LOGIN_FAILURE_WINDOW = env_duration("DLQ_LOGIN_FAILURE_WINDOW", "15m", minimum=1)
DLQ_LOGIN_LOCKOUT = env_duration("DLQ_LOGIN_LOCKOUT", "15m", minimum=1)
# The reverse proxies in front of the console (networks, comma-separated). A request from one of them is counted,
# throttled and audited by the address its X-Forwarded-For names: the nearest one outside these networks, read
# from the right, since a client can write anything to the left of what the proxies append. Empty (the default):
# REMOTE_ADDR, and X-Forwarded-For is never read.
DLQ_TRUSTED_PROXIES = env_networks("DLQ_TRUSTED_PROXIES", [])
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
MEDIA_ROOT = VAR_DIR / "media"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Content Security Policy: scripts only from our own static files (htmx, two small helpers), so markup that
# slipped through escaping still could not run script. Inline styles stay allowed (style attributes, htmx's
# indicator styles).
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
# Behind TLS (README, "Behind TLS"). Cookies only over HTTPS:
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# The header a TLS-terminating proxy sets to "https" (X-Forwarded-Proto); empty: no header is trusted to say so.
_proxy_ssl_header = env_str("SECURE_PROXY_SSL_HEADER", "").strip()
if _proxy_ssl_header and not re.fullmatch(r"[A-Za-z0-9-]+", _proxy_ssl_header):
    raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER must be a header name, not {_proxy_ssl_header!r}")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)
# Redirect plain HTTP to HTTPS, except /healthz and /metrics: container health checks and Prometheus call them
# inside the network, over plain HTTP.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
# HTTP Strict Transport Security: seconds browsers remember to use HTTPS only (0: no header), for subdomains too,
# and the consent to browsers' preload lists.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

# Broker and background work.
AMQP_URL = env_str("AMQP_URL", "amqp://guest:guest@localhost:5672/%2F")
REDIS_URL = env_str("REDIS_URL", "")
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", AMQP_URL)
# RabbitMQ's management HTTP API, asked when planning whether a retry's exchange routes its key to any queue
# (AMQP cannot tell): empty derives it from AMQP_URL (same host and login, port 15672); "off" skips the check.
RABBITMQ_API_URL = env_str("RABBITMQ_API_URL", "")
# More brokers, each an AMQP endpoint with its vhost: `name=amqp://...;other=amqps://...`. They are managed here
# (read-only in the admin, their credentials never stored); the broker `default` is AMQP_URL. Their management
# APIs: DLQ_BROKER_API_URLS (`name=https://...;other=off`), else derived from each AMQP URL as for AMQP_URL.
DLQ_BROKERS = env_mapping("DLQ_BROKERS", name_pattern=BROKER_NAME)
if "default" in DLQ_BROKERS:
    raise ImproperlyConfigured("DLQ_BROKERS must not name 'default': the broker default is AMQP_URL")
for _name, _url in DLQ_BROKERS.items():
    if _problem := check_amqp_url(_url):
        raise ImproperlyConfigured(f"DLQ_BROKERS: the URL of {_name} is no AMQP URL: {_problem}")
DLQ_BROKER_API_URLS = env_mapping("DLQ_BROKER_API_URLS", name_pattern=BROKER_NAME)
# Encrypts the credentials of brokers added in the admin (Fernet). Several keys, comma-separated: the first
# encrypts, every one decrypts (rotate by putting the new key first). Any text; it is stretched to a key.
DLQ_CREDENTIALS_KEY = env_str("DLQ_CREDENTIALS_KEY", "")
# Error reports (the DEBUG page, error e-mails) hide every setting that may hold a URL with a password.
DEFAULT_EXCEPTION_REPORTER_FILTER = "dlqconsole.core.error_reports.ReporterFilter"
# Django's cache holds the sign-in throttle's counts: Redis when REDIS_URL is set, so every web process shares
# them; without it each process counts on its own (local memory).
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "dlqconsole",
            # A Redis that is gone costs a sign-in a second, not a hung request (the throttle then lets it in).
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "dlqconsole")
# Two queues. The default one carries long work (operations, which may run for hours at a low rate, and export
# files); the control queue carries the short tasks that must never wait behind them: alert evaluation and
# notifications, queue sampling, the operation sweeper, automatic retry scheduling, retention. `make run` and
# docker compose run a worker for each; a worker started without -Q/-X consumes both.
DLQ_CONTROL_QUEUE = env_str("DLQ_CONTROL_QUEUE", "") or f"{CELERY_TASK_DEFAULT_QUEUE}.control"
if DLQ_CONTROL_QUEUE == CELERY_TASK_DEFAULT_QUEUE:
    raise ImproperlyConfigured("DLQ_CONTROL_QUEUE must differ from CELERY_TASK_DEFAULT_QUEUE")
# Retention is bulk work (minutes of deletion after a mass archive): it stays on the default queue.
CONTROL_TASKS = (
    "alerts.evaluate_alerts",
    "alerts.send_notification",
    "alerts.retry_notifications",
    "alerts.sample_queues",
    "alerts.prune_notifications",
    "operations.sweep_operations",
    "operations.schedule_new_dead_letters",
    "operations.start_due_retries",
    "deadletters.delete_expired_exports",
    "deadletters.prune_arrival_counts",
    "accounts.prune_audit",
)
CELERY_TASK_ROUTES = {name: {"queue": DLQ_CONTROL_QUEUE} for name in CONTROL_TASKS}
CELERY_TASK_QUEUES = [
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in (CELERY_TASK_DEFAULT_QUEUE, DLQ_CONTROL_QUEUE)
]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
# Operations: hand stale operations to a live worker, schedule and start automatic retries, retention of finished
# dead letters and operations, old export files and the dashboard's old arrival counts.
CELERY_BEAT_SCHEDULE |= {
    "operations-sweep": {"task": "operations.sweep_operations", "schedule": 15.0},
    "operations-schedule-retries": {"task": "operations.schedule_new_dead_letters", "schedule": 5.0},
    "operations-due-retries": {"task": "operations.start_due_retries", "schedule": 10.0},
    # Deletes archived, replayed and moved dead letters and old operations' item rows past their retention: a run
    # of at most four minutes, paced (operations/retention.py), so it ends before the next one is due.
    "operations-retention": {
        "task": "operations.apply_retention",
        "schedule": 300.0,
        "options": {"expires": 240},
    },
    "deadletters-export-retention": {
        "task": "deadletters.delete_expired_exports",
        "schedule": 3600.0,
        "options": {"expires": 1800},
    },
    # Prunes the per-minute and per-hour arrival counts past every chart's window.
    "deadletters-arrival-retention": {
        "task": "deadletters.prune_arrival_counts",
        "schedule": 3600.0,
        "options": {"expires": 1800},
    },
    # Fills in the search text of dead letters stored before it existed, a bounded batch a minute (bulk work: the
    # default queue).
    "deadletters-search-fill": {"task": "deadletters.fill_search_text", "schedule": 60.0, "options": {"expires": 50}},
}
# Export files written in the background are deleted this long after they were written.
DLQ_EXPORT_RETENTION_HOURS = env_int("DLQ_EXPORT_RETENTION_HOURS", 24, minimum=1)
# Exports one person may run at once, streamed ones included; a further one is refused.
DLQ_EXPORTS_PER_USER = env_int("DLQ_EXPORTS_PER_USER", 2, minimum=1)
# Background exports written at once across all workers; one more waits without holding its worker.
DLQ_EXPORT_CONCURRENCY = env_int("DLQ_EXPORT_CONCURRENCY", 1, minimum=1)
# Seconds one database read of an export may take (PostgreSQL); past it the export ends with an error line.
DLQ_EXPORT_READ_TIMEOUT_SECONDS = env_float("DLQ_EXPORT_READ_TIMEOUT_SECONDS", 30.0, minimum=0.1)
# Alerts: evaluate the rules every few seconds (a first dead letter alerts within seconds), sample watched queue
# depths, re-enqueue due notification retries and send due digests. A tick that could not start in time is
# dropped, not piled up.
DLQ_ALERT_EVALUATION_SECONDS = env_float("DLQ_ALERT_EVALUATION_SECONDS", 2.0, minimum=0.5)
DLQ_QUEUE_SAMPLE_SECONDS = env_float("DLQ_QUEUE_SAMPLE_SECONDS", 5.0, minimum=1.0)
DLQ_QUEUE_SAMPLE_RETENTION_HOURS = env_int("DLQ_QUEUE_SAMPLE_RETENTION_HOURS", 48, minimum=1)
# Sent, failed, digested and silenced notifications are deleted this long after they were created (hourly).
DLQ_NOTIFICATION_RETENTION_DAYS = env_int("DLQ_NOTIFICATION_RETENTION_DAYS", 90, minimum=1)
# Audit rows (and what they keep, such as a purge's list of the dead letters it deleted) are deleted this long
# after they were written (hourly).
DLQ_AUDIT_RETENTION_DAYS = env_int("DLQ_AUDIT_RETENTION_DAYS", 400, minimum=1)
# The JSON API (/api/v1/, docs/api.md): requests per personal token, N/period[:burst] as for replay rates.
DLQ_API_TOKEN_RATE = env_str("DLQ_API_TOKEN_RATE", "20/1s:200")
try:
    parse_rate(DLQ_API_TOKEN_RATE)
except ValueError as _problem:
    raise ImproperlyConfigured(f"DLQ_API_TOKEN_RATE: {_problem}") from None
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "dlqconsole.api.authentication.TokenAuthentication",
        # The docs page's "Try it out" as the signed-in user (with the CSRF header, as for the pages).
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["dlqconsole.api.permissions.RolePermission"],
    "DEFAULT_THROTTLE_CLASSES": ["dlqconsole.api.throttling.TokenRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["dlqconsole.api.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "dlqconsole.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "dlqconsole API",
    "DESCRIPTION": "Dead letters, failure patterns, operations, alerts and the audit log of a dlqconsole. "
    "Authenticate with a personal token (your API tokens page, or `manage.py api_token create USER`) sent as "
    "`Authorization: Bearer <token>`. A token acts with its user's current role.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # The schema offers the token alone: the docs page sends its session cookie (and CSRF header) by itself, and a
    # cookie scheme in "Authorize" only misleads.
    "AUTHENTICATION_WHITELIST": ["dlqconsole.api.authentication.TokenAuthentication"],
    "COMPONENT_SPLIT_REQUEST": True,
    # Choice sets that several components share (a list row, a detail, a link) get one name each.
    "ENUM_NAME_OVERRIDES": {
        "DeadLetterStatusEnum": "dlqconsole.deadletters.models.DeadLetterStatus",
        "PatternStatusEnum": "dlqconsole.deadletters.models.PatternStatus",
        "FailureReasonEnum": "dlqconsole.deadletters.models.FailureReason",
        "DeathReasonEnum": "dlqconsole.deadletters.models.DeathReason",
    },
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": False, "displayRequestDuration": True},
}
CELERY_BEAT_SCHEDULE |= {
    "accounts-audit-retention": {"task": "accounts.prune_audit", "schedule": 3600.0, "options": {"expires": 1800}},
}
CELERY_BEAT_SCHEDULE |= {
    "alerts-evaluate": {
        "task": "alerts.evaluate_alerts",
        "schedule": DLQ_ALERT_EVALUATION_SECONDS,
        "options": {"expires": 5 * DLQ_ALERT_EVALUATION_SECONDS},
    },
    "alerts-sample-queues": {
        "task": "alerts.sample_queues",
        "schedule": DLQ_QUEUE_SAMPLE_SECONDS,
        "options": {"expires": 2 * DLQ_QUEUE_SAMPLE_SECONDS},
    },
    "alerts-retry-notifications": {"task": "alerts.retry_notifications", "schedule": 5.0, "options": {"expires": 30}},
    "alerts-notification-retention": {
        "task": "alerts.prune_notifications",
        "schedule": 3600.0,
        "options": {"expires": 1800},
    },
}

# Dead-letter queues drained by consume_dlq when --queues is not given.
DLQ_QUEUES = env_list("DLQ_QUEUES", [])
DLQ_CONSUMER_PREFETCH = env_int("DLQ_CONSUMER_PREFETCH", 1000, minimum=1)
DLQ_CONSUMER_BATCH_SIZE = env_int("DLQ_CONSUMER_BATCH_SIZE", 500, minimum=1)
DLQ_CONSUMER_BATCH_SECONDS = env_float("DLQ_CONSUMER_BATCH_SECONDS", 0.2, minimum=0.0)
# Bytes of message bodies one consumer process holds at most (received, not yet acked, across all its queues): past
# it, it stops reading until a batch is written. A batch is written at DLQ_CONSUMER_BATCH_BYTES of bodies at most.
DLQ_CONSUMER_MAX_BYTES = env_int("DLQ_CONSUMER_MAX_BYTES", 256 * 1024 * 1024, minimum=1024 * 1024)
DLQ_CONSUMER_BATCH_BYTES = env_int("DLQ_CONSUMER_BATCH_BYTES", 32 * 1024 * 1024, minimum=1024)
# consume_dlq touches this file every few seconds while it runs (docker compose's health check reads its age);
# empty to switch it off.
DLQ_CONSUMER_HEARTBEAT_FILE = env_str("DLQ_CONSUMER_HEARTBEAT_FILE", str(VAR_DIR / "consume_dlq.alive"))
# Consumer processes per consume_dlq (0: one per core, at most 4, on PostgreSQL; one on SQLite).
DLQ_CONSUMER_PROCESSES = env_int("DLQ_CONSUMER_PROCESSES", 0, minimum=0)
# Pages show at most this much of a body (the rest is a download away) instead of rendering megabytes; at most
# 128 KB, so that no page passes 5 MB whatever the body holds (deadletters/payload.py).
DLQ_BODY_PREVIEW_BYTES = env_int("DLQ_BODY_PREVIEW_BYTES", 64 * 1024, minimum=1024, maximum=128 * 1024)
# A body larger than this is stored cut to this size, with its full size and SHA-256 in parse_errors, and cannot be
# replayed (the message sent would not be the one that died): one flood of huge messages must not fill the database.
DLQ_MAX_BODY_BYTES = env_int("DLQ_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
DLQ_ARCHIVE_RETENTION_DAYS = env_int("DLQ_ARCHIVE_RETENTION_DAYS", 30, minimum=1)
# Dead letters replayed or moved longer ago than this (from their status change) are deleted, as are the item rows
# of operations finished longer ago (the operation keeps its summary).
DLQ_FINISHED_RETENTION_DAYS = env_int("DLQ_FINISHED_RETENTION_DAYS", 14, minimum=1)
# Text search reads the error type, the error message and this many bytes of the body (deadletters/search.py).
DLQ_SEARCH_BODY_BYTES = env_int("DLQ_SEARCH_BODY_BYTES", 4096, minimum=0, maximum=64 * 1024)
# Operations (bulk retry / move / archive / restore / purge): dead letters per chunk (at most this many are in
# flight, so at most this many can be published twice if a worker dies), unconfirmed publishes in the window,
# seconds without a heartbeat before the sweeper hands an operation to another worker, and the share of replays
# coming back to a DLQ that pauses an operation.
DLQ_OPERATION_CHUNK_SIZE = env_int("DLQ_OPERATION_CHUNK_SIZE", 2000, minimum=1)
DLQ_PUBLISH_WINDOW = env_int("DLQ_PUBLISH_WINDOW", 1000, minimum=1)
# The rate a retry or move planned on the pages starts with (the operator may change or clear it): a service that
# just came back is not flooded by default. Empty: no limit.
DLQ_DEFAULT_REPLAY_RATE = env_str("DLQ_DEFAULT_REPLAY_RATE", "100/1s")
DLQ_OPERATION_STALE_SECONDS = env_int("DLQ_OPERATION_STALE_SECONDS", 60, minimum=1)
DLQ_OPERATION_MAX_RETURN_SHARE = env_float("DLQ_OPERATION_MAX_RETURN_SHARE", 0.2, minimum=0.0)
DLQ_CANARY_WAIT_SECONDS = env_int("DLQ_CANARY_WAIT_SECONDS", 60, minimum=0)
# Shed (operations/shedding.py): the messages a scan holds unacked at most while it looks deeper into a queue (its
# prefetch window; AMQP's prefetch count stops at 65535), and the seconds without a delivery that end a scan.
DLQ_SHED_HOLD = env_int("DLQ_SHED_HOLD", 10000, minimum=1, maximum=65000)
DLQ_SHED_IDLE_SECONDS = env_int("DLQ_SHED_IDLE_SECONDS", 2, minimum=1, maximum=3600)
# The circuit breaker of each replay destination (core/breaker.py; per destination in the admin): it opens after
# this many refusals or boomerangs in a row, or when this share of at least the minimum sample of recent outcomes
# failed; stays open for the cool-down; then lets a probe of this many messages out and closes when none comes back
# within the watch. A replay that dies again within the window after it was sent is a boomerang.
DLQ_BREAKER_FAILURES = env_int("DLQ_BREAKER_FAILURES", 20, minimum=1, maximum=1000)
DLQ_BREAKER_FAILURE_SHARE = env_float("DLQ_BREAKER_FAILURE_SHARE", 0.5, minimum=0.01, maximum=1.0)
DLQ_BREAKER_MIN_SAMPLE = env_int("DLQ_BREAKER_MIN_SAMPLE", 20, minimum=1, maximum=1000)
DLQ_BREAKER_COOLDOWN_SECONDS = env_int("DLQ_BREAKER_COOLDOWN_SECONDS", 60, minimum=1)
DLQ_BREAKER_PROBE_SIZE = env_int("DLQ_BREAKER_PROBE_SIZE", 5, minimum=1, maximum=1000)
DLQ_BREAKER_WATCH_SECONDS = env_int("DLQ_BREAKER_WATCH_SECONDS", 60, minimum=1)
DLQ_BREAKER_WINDOW_SECONDS = env_int("DLQ_BREAKER_WINDOW_SECONDS", 300, minimum=1)

# Application headers (matched without regard to case) read for the error type, message, stack trace, host
# and version, in order of preference.
# A deployment whose services use other names lists them here (comma-separated in the environment).
DLQ_ERROR_TYPE_HEADERS = env_list(
    "DLQ_ERROR_TYPE_HEADERS",
    [
        "x-exception-type",
        "x-exception-class",
        "exception-type",
        "x-error-type",
        "error-type",
        "exception_type",
        "mt-fault-exceptiontype",
        "nservicebus.exceptioninfo.exceptiontype",
    ],
)
DLQ_ERROR_MESSAGE_HEADERS = env_list(
    "DLQ_ERROR_MESSAGE_HEADERS",
    [
        "x-exception-message",
        "exception-message",
        "x-error-message",
        "error-message",
        "x-error",
        "error",
        "exception_message",
        "mt-fault-message",
        "nservicebus.exceptioninfo.message",
    ],
)
DLQ_STACK_TRACE_HEADERS = env_list(
    "DLQ_STACK_TRACE_HEADERS",
    [
        "x-exception-stacktrace",
        "x-exception-stack-trace",
        "x-stack-trace",
        "x-traceback",
        "stacktrace",
        "traceback",
        "mt-fault-stacktrace",
        "nservicebus.exceptioninfo.stacktrace",
    ],
)
DLQ_HOST_HEADERS = env_list(
    "DLQ_HOST_HEADERS",
    [
        "x-host",
        "x-processing-host",
        "x-origin-host",
        "hostname",
        "host",
        "mt-host-machinename",
        "nservicebus.processingmachine",
    ],
)
DLQ_VERSION_HEADERS = env_list(
    "DLQ_VERSION_HEADERS",
    [
        "x-app-version",
        "app-version",
        "x-agent-version",
        "x-service-version",
        "mt-host-assembly-version",
        "nservicebus.version",
    ],
)
# Headers our replays add (they must not start with "x-", which RabbitMQ reserves for the headers it writes and a
# replay strips): how often the message was replayed, and the id of the dead letter it was replayed from, so a
# boomerang links to its first record.
DLQ_REPLAY_COUNT_HEADER = env_str("DLQ_REPLAY_COUNT_HEADER", "dlq-replay-count")
DLQ_REPLAYED_FROM_HEADER = env_str("DLQ_REPLAYED_FROM_HEADER", "dlq-replayed-from")


def _without_client_error_traceback(record: logging.LogRecord) -> logging.LogRecord:
    """django.request logs a 403 (PermissionDenied) or 400 with the exception's full traceback, and
    django.security.* (DisallowedHost, SuspiciousOperation) a 400 the same way: one line is enough for a refusal
    that is the console working as meant. 5xx keep theirs. A filter on the handler, not on those loggers: a
    logger's filters do not see records from its children (django.security.DisallowedHost). It returns a copy
    without the traceback, so other handlers (an error tracker) still get the original."""
    if getattr(record, "status_code", 500) < 500 and (record.exc_info or record.exc_text):
        record = copy.copy(record)
        record.exc_info = None
        record.exc_text = None
    return record


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s [%(process)d] %(name)s %(message)s"}},
    "filters": {"client_errors_one_line": {"()": lambda: _without_client_error_traceback}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["client_errors_one_line"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # pika logs a lost connection as an ERROR with its traceback, naming no broker; the consumer and the replay
    # worker log each such loss themselves, naming the broker and what they do about it.
    "loggers": {"pika": {"level": "CRITICAL"}},
}

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "dlqconsole@localhost")
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)

# Alert notifications: links in messages point at DLQ_CONSOLE_URL; outbound HTTP gives up after
# DLQ_HTTP_TIMEOUT_SECONDS; a failed send is retried after 10 s, 30 s, 90 s, ... up to the attempt limit; a
# channel whose notifications fail this many times in a row is switched off. /metrics labels at most
# DLQ_METRICS_MAX_QUEUES queues (the rest are summed under queue="other").
# Empty counts as unset (make run sets it from BIND and PORT).
DLQ_CONSOLE_URL = env_str("DLQ_CONSOLE_URL", "") or "http://localhost:8000"
DLQ_HTTP_TIMEOUT_SECONDS = env_float("DLQ_HTTP_TIMEOUT_SECONDS", 5.0, minimum=0.1)
# Networks webhook and Slack notifications are never sent to, checked when a channel is saved and on the addresses
# a host name resolves to when it is sent: link-local (169.254.169.254 is the cloud metadata service), the
# metadata services outside it (AWS's IPv6 fd00:ec2::254, Alibaba's 100.100.100.200), 0.0.0.0/8, broadcast and
# multicast. Loopback and private ranges stay allowed (receivers inside the network). An IPv6 address that
# embeds an IPv4 one (mapped, NAT64 and its local use, 6to4, Teredo, compatible) is checked as that IPv4 address
# (core/http.py).
DLQ_WEBHOOK_DENIED_NETWORKS = env_networks(
    "DLQ_WEBHOOK_DENIED_NETWORKS",
    [
        "169.254.0.0/16",
        "fe80::/10",
        "fd00:ec2::254/128",
        "100.100.100.200/32",
        "0.0.0.0/8",
        "255.255.255.255/32",
        "224.0.0.0/4",
        "::/128",
        "ff00::/8",
    ],
)
DLQ_NOTIFICATION_RETRY_SECONDS = env_float("DLQ_NOTIFICATION_RETRY_SECONDS", 10.0, minimum=0.0)
DLQ_NOTIFICATION_MAX_ATTEMPTS = env_int("DLQ_NOTIFICATION_MAX_ATTEMPTS", 5, minimum=1)
DLQ_CHANNEL_DISABLE_AFTER = env_int("DLQ_CHANNEL_DISABLE_AFTER", 3, minimum=1)
# A storm of notices becomes a digest: per channel, at most DLQ_NOTIFY_BURST notices go out one by one within
# DLQ_NOTIFY_WINDOW (opened by the first notice of a quiet channel, which is never delayed); the rest go out
# together as one digest when the window ends.
DLQ_NOTIFY_BURST = env_int("DLQ_NOTIFY_BURST", 5, minimum=1)
DLQ_NOTIFY_WINDOW = env_duration("DLQ_NOTIFY_WINDOW", "5m", minimum=1)
DLQ_METRICS_MAX_QUEUES = env_int("DLQ_METRICS_MAX_QUEUES", 50, minimum=1)
# When set, /metrics answers only requests with `Authorization: Bearer <this token>` (401 otherwise).
DLQ_METRICS_TOKEN = env_str("DLQ_METRICS_TOKEN", "")
# /healthz asks the broker at most once in this many seconds per web process (it needs no login).
DLQ_HEALTHZ_BROKER_CACHE_SECONDS = env_float("DLQ_HEALTHZ_BROKER_CACHE_SECONDS", 5.0, minimum=0.0)
