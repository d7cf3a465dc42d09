"""Settings for Grundlag approvals.

Every deployment knob is an environment variable whose default runs on one machine with
nothing installed: SQLite, an in-process Celery broker and an in-memory channel layer.
Set ``DATABASE_URL`` and ``REDIS_URL`` to scale out (see docs/how-to/deploy.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import sqlite3
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

# Lets ModelAdmin[Team], QuerySet[Run] and friends be subscripted at run time, for mypy.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


def envbool(name: str, default: str) -> bool:
    value = os.getenv(name, default).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {value!r}")


def envint(name: str, default: str, *, minimum: int = 0) -> int:
    value = os.getenv(name, default)
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    return number


def envfloat(name: str, default: str, *, minimum: float = 0.0) -> float:
    value = os.getenv(name, default)
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from None
    if not number >= minimum:  # also refuses nan
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return number


def envchoice(name: str, default: str, choices: set[str]) -> str:
    value = os.getenv(name, default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(sorted(choices))}, got {value!r}")
    return value


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.getenv(name, default).split(",") if item.strip()]


# Off unless asked for (`make dev`): a debug page shows settings and code to whoever hits an error.
DEBUG = envbool("DEBUG", "false")

# The server's own files (the embedded database, the generated key): readable by its user only.
VAR_DIR = Path(os.getenv("GRUNDLAG_VAR_DIR", str(BASE_DIR / "var")))


def private_dir(path: Path) -> Path:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)
    except OSError as exc:
        raise ImproperlyConfigured(f"GRUNDLAG_VAR_DIR ({path}) cannot be made private: {exc}") from None
    return path


def private_file(path: Path) -> Path:
    """``path``, created empty and readable by this user only if it does not exist yet."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return path


def generated_secret_key() -> str:
    """A random key kept in VAR_DIR, made on first use: one machine needs no configuration, and
    no two installations share a key. Several machines must share SECRET_KEY instead."""
    key_file = private_file(private_dir(VAR_DIR) / "secret_key")
    key = key_file.read_text().strip()
    if not key:
        import secrets

        key = secrets.token_urlsafe(50)
        key_file.write_text(key)
    return key


# Django's secret key: the mails' decision links and MCP task ids are signed with it, and sessions
# are bound to it. Unset, a random key is made once in GRUNDLAG_VAR_DIR/secret_key (with DEBUG, a
# fixed development key, public in this source: never run with DEBUG where others can reach the
# site unless SECRET_KEY is set). Every machine of one site must share it; changing it signs
# everyone out and voids the links already mailed, unless the old key is kept, comma-separated, in
# SECRET_KEY_FALLBACKS: then those still verify, and what the site keeps sealed with it (an MCP
# upstream's credentials, the receipts' keys) still opens.
SECRET_KEY = os.getenv("SECRET_KEY", "")
if not SECRET_KEY:
    SECRET_KEY = "insecure-development-key-do-not-use-in-production" if DEBUG else generated_secret_key()
# Former SECRET_KEYs, comma-separated, while what they signed or sealed is still in use (see above).
SECRET_KEY_FALLBACKS = envlist("SECRET_KEY_FALLBACKS", "")

# Django's ALLOWED_HOSTS: the host names the site answers to, comma-separated (another gets 400).
# By default this machine's (127.0.0.1, localhost) and Django's test client's (testserver): set the
# public name. Also the default of GRUNDLAG_ALLOWED_ORIGINS.
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
# Django's CSRF_TRUSTED_ORIGINS: origins (https://host[:port]), comma-separated, whose form posts
# are accepted besides the site's own; list the public origin when the proxy in front changes the
# scheme or host that Django sees.
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")
# The site's name: in its pages' titles, its mails' subjects (in brackets) and its Slack replies.
SITE_NAME = os.getenv("SITE_NAME", "Grundlag approvals")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "axes",
    "csp",
    "actions",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "actions.web.middleware.ApiJsonErrorsMiddleware",
    "actions.web.middleware.RequestSizeLimitMiddleware",
    # An API query parameter the operation does not take: 422, before anything is recorded.
    "actions.api.KnownQueryParameters",
    # Before the API's views, after the size limit: a retried POST is answered as it was first.
    "actions.web.middleware.IdempotencyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "actions.web.middleware.DatabaseUnavailableMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns its lock-out signal into the lock-out response.
    "actions.web.middleware.AxesMiddleware",
]

# Content-Security-Policy (django-csp): scripts only from this site's own files, nothing inline
# and nothing evaluated (htmx runs with allowEval off). Styles may be inline (the admin's).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

AUTHENTICATION_BACKENDS = [
    # Single sign-on's callback (it alone passes a nonce): the provider's, before any password.
    "actions.web.sso.SignInBackend",
    # First: a client address or username that failed too often recently (spraying) waits.
    "actions.web.auth.SprayThrottleBackend",
    # Then: refuses a locked-out (username, address) pair before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "grundlag_site.urls"
WSGI_APPLICATION = "grundlag_site.wsgi.application"
ASGI_APPLICATION = "grundlag_site.asgi.application"

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
                "actions.web.views.site_context",
            ],
        },
    },
]

# Database: SQLite by default, anything dj-database-url understands otherwise.
DATABASE_URL = os.getenv("DATABASE_URL", "")
if not DATABASE_URL:
    # The embedded database, in a directory only the server's user can enter; the file (and
    # its -wal and -shm companions, which SQLite creates with the file's mode) readable by it
    # only. (Earlier releases kept it in the project folder: move grundlag.sqlite3 to var/.)
    _embedded = private_file(private_dir(VAR_DIR) / "grundlag.sqlite3")
    _embedded.chmod(0o600)
    DATABASE_URL = f"sqlite:///{_embedded}"
# PostgreSQL: statements are sent with their values as parameters, and a statement a connection
# has run 5 times is prepared (parsed once, and planned once where one plan serves any values):
# about 30 % less of the server's CPU an engine cycle (bench/RESULTS.md). Turn it off (false)
# behind a pooler that cannot keep prepared statements, such as PgBouncer before 1.22 in
# transaction mode (1.22 and later keep them with its max_prepared_statements set; psycopg's
# binary package brings the libpq 17 or later they need).
POSTGRESQL_STATEMENT_OPTIONS: dict[str, Any] = (
    {"server_side_binding": True, "prepare_threshold": 5} if envbool("DB_PREPARED_STATEMENTS", "true") else {}
)
try:
    # Django's CONN_MAX_AGE, in seconds: how long a thread keeps its connection for the next
    # request (0: closed after each). With PostgreSQL's pool (DB_POOL_SIZE, on by default) it must
    # stay 0.
    _database = dj_database_url.parse(DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", "0"))
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
if _database["ENGINE"] == "django.db.backends.sqlite3":
    if sqlite3.sqlite_version_info < (3, 35):
        # The engine's claims and inserts use RETURNING (actions/engine/store.py).
        raise ImproperlyConfigured(
            f"SQLite 3.35 or later is required; this Python has {sqlite3.sqlite_version}"
        )
    # Several threads (web requests and the embedded worker) write at once. WAL lets readers
    # proceed during a write; IMMEDIATE takes the write lock at BEGIN, so two writers queue on
    # the timeout instead of one failing with "database is locked" when it upgrades its lock.
    # The WAL is copied back into the database (a checkpoint, which syncs both files) once it
    # holds this many pages. SQLite's default, 1,000 (4 MB), made every 25th run step pay for
    # one; 8,000 (32 MB of disk) makes checkpoints rarer, each copying the same hot pages once.
    wal_pages = envint("SQLITE_WAL_AUTOCHECKPOINT", "8000", minimum=100)
    # Django's backend, whose writers take turns promptly (grundlag_site/db/sqlite3/base.py).
    _database["ENGINE"] = "grundlag_site.db.sqlite3"
    _database["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        # Seconds a connection waits for the write lock before it fails with "database is
        # locked"; raise it if that error shows under load.
        "timeout": envint("SQLITE_TIMEOUT", "20", minimum=1),
        "init_command": (
            f"PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint={wal_pages};"
        ),
    }
    # A file (threads and subprocesses share it, unlike :memory:), one per test process.
    _default_test_db = Path(tempfile.gettempdir()) / f"grundlag-test-{os.getpid()}.sqlite3"
    # The tests' SQLite database file (tests only): by default one per test process, in the
    # temporary directory. `make check` names a fixed one, which pytest's --reuse-db keeps.
    _database["TEST"] = {"NAME": os.getenv("TEST_SQLITE_NAME", str(_default_test_db))}
elif _database["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, with a transaction's BEGIN sent with its first statement, the engine's
    # journal sent with its COMMIT, and statements of more than 65,535 values still run, with
    # the values in their text (grundlag_site/db/postgresql/base.py).
    _database["ENGINE"] = "grundlag_site.db.postgresql"
    _database.setdefault("OPTIONS", {}).update(POSTGRESQL_STATEMENT_OPTIONS)
    # A pool of connections per process (psycopg_pool, Django's "pool" option), shared by its
    # threads. A connection kept per thread (CONN_MAX_AGE) instead stays open, idle, with each
    # thread the process keeps for requests (up to 32); and while Django made a thread for each
    # request, every request paid for a new connection, about 10 ms before its first query.
    # Up to DB_POOL_SIZE connections per process (by default 10, or a worker's WORKER_CONCURRENCY
    # and 4 for its other threads); 0 turns the pool off, and DB_CONN_MAX_AGE applies. A step
    # that found no connection (the database restarting) is sent again a moment later
    # (actions.tasks.run_step).
    pool_size = envint("DB_POOL_SIZE", str(max(10, envint("WORKER_CONCURRENCY", "4", minimum=1) + 4)))
    if pool_size:
        if _database.get("CONN_MAX_AGE"):
            raise ImproperlyConfigured(
                "DB_CONN_MAX_AGE keeps a connection per thread; with the connection pool"
                " (DB_POOL_SIZE) it must be 0: remove DB_CONN_MAX_AGE, or set DB_POOL_SIZE=0"
            )
        # Checked as it is lent (one empty round trip): a connection that a database restart
        # broke is replaced, not handed to a request that then fails.
        _database["CONN_HEALTH_CHECKS"] = True
        _database.setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, pool_size),
            "max_size": pool_size,
            # How long a request waits for a connection before it fails (503): for one of the
            # pool's to come free, or, with the database down, for it to come back.
            "timeout": envint("DB_POOL_TIMEOUT", "3", minimum=1),
        }
DATABASES: dict[str, Any] = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis, when set, is the Celery broker and the channel layer shared by every process.
REDIS_URL = os.getenv("REDIS_URL", "")
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, got {REDIS_URL!r}")

if REDIS_URL:
    # Pub/sub: a push is one PUBLISH, and each web process receives it once and hands it to its
    # own sockets. (The list-based layer stores a copy per socket and each process pops them
    # one round trip at a time, which put the 100th reviewer's frame 80 ms behind the first:
    # bench/push_latency.py.) Pub/sub keeps nothing for a process that is not listening; that
    # suits pushes, which are hints: pages refetch whenever their socket (re)connects.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery. Steps are idempotent (a run is claimed by a conditional UPDATE), so delivery is
# at-least-once: acknowledge after the step, and hand the message back if the worker dies.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_IGNORE_RESULT = True
# No result backend (results are ignored; the database is the truth): its stand-in is shared by
# every thread. Otherwise each thread that sends a task makes its own, scanning every installed
# package's entry points to find it: every API request runs in a thread of its own, and that
# scan was 10 % of a web process's time under bench/isolation.py.
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Threads of each Celery worker (its pool is threads: CELERY_WORKER_POOL), and of the embedded
# worker of `manage.py serve` (`make run`): how many tasks one worker runs at once. The defaults
# of DB_POOL_SIZE and of the fair shares (GRUNDLAG_TEAM_STEPS, GRUNDLAG_TEAM_SCRIPTS) follow it.
CELERY_WORKER_CONCURRENCY = envint("WORKER_CONCURRENCY", "4", minimum=1)
# Threads, not forked children: steps wait on the database and on other systems, and the
# heartbeat and the worker's metrics (actions.metrics) live in the process that runs them.
CELERY_WORKER_POOL = "threads"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Two queues: "celery" for the runs' steps and the sweeps, "notify" for fanning out and
# delivering notifications. A worker started without -Q takes both; at scale, give "notify"
# workers of their own (`-Q notify`), so that a big team's mails never hold up a step
# (deploy/Procfile).
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES: dict[str, dict[str, Any]] = {"celery": {}, "notify": {}}
CELERY_TASK_ROUTES = {
    "actions.tasks.dispatch": {"queue": "notify"},
    "actions.tasks.deliver_notification": {"queue": "notify"},
    "actions.tasks.deliver_notifications": {"queue": "notify"},
    "actions.tasks.notify": {"queue": "notify"},
}
# Longer than the longest step: Redis redelivers an unacknowledged message after this.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": envint("STEP_VISIBILITY_TIMEOUT", "3600")}
# Celery's eager mode: every task (steps, notifications) runs in the process and thread that sends
# it, when it is sent, with no worker. For tests and benchmarks, which turn it on in code
# (grundlag_site.celery.run_tasks_where_sent); to run steps where they are queued, see
# GRUNDLAG_INLINE_STEPS.
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", "false")

# Grundlag itself.

# The modules that define the site's actions, comma-separated (myteam.actions): imported when
# Django starts, which registers each @action in them. The default is the demo's actions.
GRUNDLAG_ACTION_MODULES = envlist("GRUNDLAG_ACTION_MODULES", "actions.examples")
# A step's lease: its worker renews it every third of this while the step runs (a heartbeat),
# so a step may take as long as it needs; a step whose worker died is found by the sweeper
# once its lease has run out, and re-queued. Short, so that takes seconds, not minutes.
GRUNDLAG_STEP_LEASE_SECONDS = envint("GRUNDLAG_STEP_LEASE_SECONDS", "9", minimum=1)
# A step running longer than this stops having its lease renewed: stuck for good, it is
# re-queued, and fails its run after GRUNDLAG_MAX_STEP_REQUEUES.
GRUNDLAG_MAX_STEP_SECONDS = envint("GRUNDLAG_MAX_STEP_SECONDS", "3600", minimum=1)
# How often the sweeper looks for such steps (Celery beat in the scaled setup, a thread of
# `manage.py serve` in the embedded one).
GRUNDLAG_SWEEP_SECONDS = envfloat("GRUNDLAG_SWEEP_SECONDS", "3", minimum=0.5)
# A step queued this long without being claimed is presumed to have lost its message (a broker
# restart without persistence) and is sent again; a duplicate message claims nothing. Each
# queued step is sent again at most once per grace: where a backlog longer than this is normal,
# raise it, or the broker carries a duplicate per waiting step every grace.
GRUNDLAG_QUEUED_GRACE_SECONDS = envint("GRUNDLAG_QUEUED_GRACE_SECONDS", "10", minimum=1)
# Each round expires when the next is due: with no worker taking its queue (a "notify" worker
# not started yet), rounds do not pile up in the broker to all run at once later.
CELERY_BEAT_SCHEDULE = {
    "sweep-stuck-runs": {
        "task": "actions.tasks.sweep",
        "schedule": GRUNDLAG_SWEEP_SECONDS,
        "options": {"expires": GRUNDLAG_SWEEP_SECONDS},
    },
    "apply-deadlines-and-escalations": {
        "task": "actions.tasks.apply_policies",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
    "notify": {
        "task": "actions.tasks.notify",
        "schedule": GRUNDLAG_SWEEP_SECONDS,
        "options": {"expires": GRUNDLAG_SWEEP_SECONDS},
    },
    # Publishes the audit chain's head (and verifies it) when the last was a day ago.
    "audit-head": {"task": "actions.tasks.audit_daily", "schedule": 3600.0, "options": {"expires": 3600.0}},
}
# Notifications (actions.notify). The site's address, for the links in mails, Slack messages,
# webhook bodies and MCP results; by default this machine at the port `make run` serves on
# (PORT), so that links follow `PORT=8170 make run`.
GRUNDLAG_BASE_URL = os.getenv("GRUNDLAG_BASE_URL") or f"http://127.0.0.1:{envint('PORT', '8000', minimum=1)}"
# Allow webhook endpoints that resolve to private, loopback or link-local addresses. Off, an
# endpoint must resolve to public addresses only, when it is registered and again at each
# delivery: the server cannot be made to call into its own network. For tests, or a site whose
# receivers are all inside its network.
GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = envbool("GRUNDLAG_WEBHOOK_ALLOW_PRIVATE", "false")
# Timeout of one webhook delivery, in seconds, for each of connecting, sending and waiting for the
# answer: past it the try has failed. Also the Slack client's, rounded up to whole seconds.
GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS = envfloat("GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS", "5", minimum=0.1)
# Tries of one notification (a mail, a Slack message, a webhook delivery) before it is marked
# failed: again after 10 s, 20 s, 40 s ..., at most an hour apart (12 tries span about 3.4 hours).
GRUNDLAG_NOTIFY_MAX_ATTEMPTS = envint("GRUNDLAG_NOTIFY_MAX_ATTEMPTS", "12", minimum=1)
# A process's commits that ask for notifications within this time are fanned out together
# (scaled: as one task of the `notify` queue); 0: without waiting.
GRUNDLAG_DISPATCH_GATHER_SECONDS = envfloat("GRUNDLAG_DISPATCH_GATHER_SECONDS", "0.05")
# A webhook endpoint whose every delivery has failed for this long (seconds, from the first failure
# after a success; a day by default) is disabled, with the reason shown in the team's webhook list
# and the admin.
GRUNDLAG_WEBHOOK_DISABLE_AFTER_SECONDS = envint("GRUNDLAG_WEBHOOK_DISABLE_AFTER_SECONDS", "86400", minimum=60)
# How long a claimed notification is left to its sender (a worker that died mid-send) before it
# is sent again.
GRUNDLAG_SEND_LEASE_SECONDS = envint("GRUNDLAG_SEND_LEASE_SECONDS", "60", minimum=1)
# Reviewers are reminded (interrupt.expiring) this long before an interrupt's deadline, in seconds.
GRUNDLAG_REMIND_BEFORE_SECONDS = envint("GRUNDLAG_REMIND_BEFORE_SECONDS", "3600", minimum=60)
# The mails of those who chose a digest are gathered and go out together at the end of each
# period of this many seconds (periods counted from the Unix epoch: 3600 sends on the hour, UTC).
GRUNDLAG_DIGEST_SECONDS = envint("GRUNDLAG_DIGEST_SECONDS", "3600", minimum=60)
# A mail's decision link works until the interrupt's deadline, or for this many days after the
# mail if that comes first (the mail says so).
GRUNDLAG_LINK_DAYS = envint("GRUNDLAG_LINK_DAYS", "7", minimum=1)

# Mail, by Django's standard settings. Without EMAIL_HOST mails are printed to the console (what
# `make run` does), so a newcomer sees them.
EMAIL_HOST = os.getenv("EMAIL_HOST", "")
# The SMTP server's port: 25, or typically 587 with EMAIL_USE_TLS and 465 with EMAIL_USE_SSL.
EMAIL_PORT = envint("EMAIL_PORT", "25", minimum=1)
# The user name to log in to the SMTP server with, if it asks for one (with EMAIL_HOST_PASSWORD).
EMAIL_HOST_USER = os.getenv("EMAIL_HOST_USER", "")
# The password for EMAIL_HOST_USER.
EMAIL_HOST_PASSWORD = os.getenv("EMAIL_HOST_PASSWORD", "")
# STARTTLS: the connection starts plain and is upgraded to TLS (usually port 587). Not with
# EMAIL_USE_SSL: the process refuses to start with both.
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", "false")
# TLS from the first byte (implicit TLS, usually port 465). Not with EMAIL_USE_TLS.
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", "false")
# Seconds a call to the SMTP server may take; past it the try has failed and the mail is tried
# again later (Django's own default is to wait forever).
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", "10", minimum=1)
# The sender (From) of the site's mails: an address the SMTP server lets the site send as.
DEFAULT_FROM_EMAIL = os.getenv("DEFAULT_FROM_EMAIL", "Grundlag <approvals@localhost>")
# Django's mail backend, a dotted path: by default SMTP when EMAIL_HOST is set, else the console.
EMAIL_BACKEND = os.getenv(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive: set one")

# Slack (actions.notify.slack). The bot's token (scopes chat:write, users:read,
# users:read.email): without it, nothing is sent to Slack.
SLACK_BOT_TOKEN = os.getenv("SLACK_BOT_TOKEN", "")
# The Slack app's signing secret: every interaction (POST /slack/interactions, the Approve and
# Reject buttons) must be signed with it. Without it, every interaction is refused (401).
SLACK_SIGNING_SECRET = os.getenv("SLACK_SIGNING_SECRET", "")
# Slack's Web API address; the tests point it at a local server.
SLACK_API_URL = os.getenv("SLACK_API_URL", "https://slack.com/api/")
# The workspace's id (T0123...): interactions from any other (a shared channel, a second
# installation) are refused. Without it, the bot token's own workspace (Slack's auth.test).
SLACK_TEAM_ID = os.getenv("SLACK_TEAM_ID", "")

# A step re-queued this often without recording how it ended fails its run.
GRUNDLAG_MAX_STEP_REQUEUES = envint("GRUNDLAG_MAX_STEP_REQUEUES", "5", minimum=1)
# Run each step in the process that queued it, right after commit, instead of in a Celery
# worker: for scripts, notebooks and tests that embed the engine, as LangGraph's invoke runs a
# graph in its caller. A process crash mid-step is recovered by the sweeper, as for a worker.
GRUNDLAG_INLINE_STEPS = envbool("GRUNDLAG_INLINE_STEPS", "false")
# The largest value a run takes or records, in bytes of JSON: an input, an answer or a reason
# (refused when sent; 413 from the API), a step's output or a pause's data (the run fails, saying
# so). A driver's state (an agent's conversation, a script's call log) may be 16 times this; a
# request body, this plus 64 KiB.
GRUNDLAG_MAX_PAYLOAD_BYTES = envint("GRUNDLAG_MAX_PAYLOAD_BYTES", str(256 * 1024), minimum=1024)
# A request carries at most one payload plus its envelope.
DATA_UPLOAD_MAX_MEMORY_SIZE = GRUNDLAG_MAX_PAYLOAD_BYTES + 64 * 1024
# Enforced before a body reaches Django, by its Content-Length or as it streams in, with 413
# (actions.web.middleware.BodyLimit, in front of the whole ASGI app, /mcp/ included).


def envorigins(name: str, default: list[str]) -> list[str]:
    """Origins as channels' OriginValidator matches them: "*", "scheme://host[:port]" (http or
    https), or a bare host (".example.com": it and its subdomains), any scheme and port."""
    origins = envlist(name, "") or default
    for origin in origins:
        if origin == "*":
            continue
        parts = urlsplit(origin if "://" in origin else f"//{origin}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {origin!r} has a bad port") from None
        if (
            parts.scheme not in ("", "http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.username
        ):
            raise ImproperlyConfigured(
                f"{name} must list origins (https://host[:port]) or hosts (.example.com), got {origin!r}"
            )
    return origins


def _origin(url: str) -> list[str]:
    """The URL's origin (scheme://host[:port]), as a list of one; none when it has no host."""
    parts = urlsplit(url)
    if not (parts.scheme and parts.hostname):
        return []
    return [f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}".lower()]


# The pages (by their Origin header) that may open the live websocket and call /mcp/: one list
# for both. A websocket from another origin, or without one, is closed; a request to /mcp/ whose
# Origin is another gets 403 before anything runs, while one without an Origin (a program, not a
# browser) goes on to the token check: the MCP transport's guard against DNS rebinding. By
# default the hosts of ALLOWED_HOSTS (what the websocket allowed before; "*" is not carried
# over: a site that takes any Host needs this list all the more) and GRUNDLAG_BASE_URL's origin.
GRUNDLAG_ALLOWED_ORIGINS = envorigins(
    "GRUNDLAG_ALLOWED_ORIGINS", [host for host in ALLOWED_HOSTS if host != "*"] + _origin(GRUNDLAG_BASE_URL)
)
GRUNDLAG_MAX_WAIT_SECONDS = 30
# A request waiting with `Prefer: wait` is woken by the run's change (the engine's signal in
# this process; PostgreSQL's NOTIFY from any). Should that be lost, it reads the run again
# after this long (actions.live.waiting.FAST_POLL_SECONDS while a change may not wake it).
GRUNDLAG_WAIT_POLL_SECONDS = envfloat("GRUNDLAG_WAIT_POLL_SECONDS", "1.0", minimum=0.05)
# An MCP tool call without a task waits this long for its run to finish, then answers that it
# is pending, with its link (actions.mcp).
GRUNDLAG_MCP_WAIT_SECONDS = envfloat("GRUNDLAG_MCP_WAIT_SECONDS", "25", minimum=0)
# The MCP gateway (actions.drivers.gateway): an upstream's tools/list is served from what it
# last said for this long, then asked again (sooner when it says its list changed).
GRUNDLAG_GATEWAY_TOOLS_SECONDS = envint("GRUNDLAG_GATEWAY_TOOLS_SECONDS", "300", minimum=0)
# One exchange with an upstream MCP server (connecting, a listing, a call and its answer) may take
# this long before it counts as failed.
GRUNDLAG_GATEWAY_CALL_SECONDS = envfloat("GRUNDLAG_GATEWAY_CALL_SECONDS", "60", minimum=1)
# A host that sends the same call again (same token, tool and arguments) within this long, before
# it has been given the first one's result, joins the first (a retry); after it, it is a new call.
GRUNDLAG_GATEWAY_RETRY_SECONDS = envint("GRUNDLAG_GATEWAY_RETRY_SECONDS", "3600", minimum=0)
# Approval receipts (actions.engine.receipts): how long a receipt is good for after its decision.
# A key retired by `manage.py receipt_keys rotate` stays in /.well-known/jwks.json this long.
GRUNDLAG_RECEIPT_SECONDS = envint("GRUNDLAG_RECEIPT_SECONDS", "3600", minimum=60)
# Production's view (actions.metrics). /metrics answers only a bearer of this token (it is off,
# 404, without one); /healthz and /readyz are open and say nothing but up / ready.
GRUNDLAG_METRICS_TOKEN = os.getenv("GRUNDLAG_METRICS_TOKEN", "")
# host:port where each Celery worker serves its own /metrics (its steps, queue waits and
# decisions); a port alone binds 127.0.0.1. Off when empty. It asks for no token: bind it to a
# private address only.
GRUNDLAG_WORKER_METRICS_ADDR = os.getenv("GRUNDLAG_WORKER_METRICS_ADDR", "")
# Sandboxed scripts: limits of the child process that runs one (the actions it calls run outside).
# CPU seconds of the child in one step (RLIMIT_CPU): past them, it is killed and the script fails.
GRUNDLAG_SANDBOX_CPU_SECONDS = envint("GRUNDLAG_SANDBOX_CPU_SECONDS", "5", minimum=1)
# Wall-clock seconds one step of a script may take, the actions it calls not counted: every read
# from the child and every write to it has this deadline, then the child is killed.
GRUNDLAG_SANDBOX_WALL_SECONDS = envint("GRUNDLAG_SANDBOX_WALL_SECONDS", "30", minimum=1)
# The child's memory, in MiB (its address space, RLIMIT_AS): an allocation past it fails, and
# with it the script.
GRUNDLAG_SANDBOX_MEMORY_BYTES = envint("GRUNDLAG_SANDBOX_MEMORY_MB", "512", minimum=64) * 1024 * 1024
# How many actions one run of a script may call, over all its steps; past it the script fails.
GRUNDLAG_SANDBOX_MAX_CALLS = envint("GRUNDLAG_SANDBOX_MAX_CALLS", "100", minimum=1)
# How large one run's call log (each call's input and result, as JSON) may grow, in bytes; past it
# the script fails.
GRUNDLAG_SANDBOX_MAX_LOG_BYTES = envint("GRUNDLAG_SANDBOX_MAX_LOG_BYTES", str(1024 * 1024), minimum=1024)
# "bwrap": scripts run inside bubblewrap (Debian's bubblewrap package), and are refused when it
# cannot start. "none": without it, a weaker sandbox (language guards, limits and a seccomp
# filter only), logged as a warning at every script. See docs/explanation/security.md.
GRUNDLAG_SANDBOX_ISOLATION = os.getenv("GRUNDLAG_SANDBOX_ISOLATION", "bwrap").strip().lower()
if GRUNDLAG_SANDBOX_ISOLATION not in ("bwrap", "none"):
    raise ImproperlyConfigured(
        f"GRUNDLAG_SANDBOX_ISOLATION must be bwrap or none, got {GRUNDLAG_SANDBOX_ISOLATION!r}"
    )
# The bubblewrap program: a name is looked up in /usr/bin and /bin only (the PATH scripts start
# with); elsewhere, give its full path.
GRUNDLAG_BWRAP = os.getenv("GRUNDLAG_BWRAP", "bwrap")
# How often an open websocket re-checks its user's session and teams.
GRUNDLAG_SOCKET_RECHECK_SECONDS = envint("GRUNDLAG_SOCKET_RECHECK_SECONDS", "30", minimum=1)
try:
    # The OpenAI-compatible chat endpoints agents may use, by name, as JSON: `{"local": {"base_url":
    # "http://127.0.0.1:11434/v1", "model": "qwen3", "api_key_env": "LOCAL_KEY"}}`. The key is read
    # from the variable that api_key_env names, when the model is called; it is never stored.
    GRUNDLAG_MODELS: dict[str, dict[str, str]] = json.loads(os.getenv("GRUNDLAG_MODELS", "{}"))
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(f"GRUNDLAG_MODELS must be JSON: {exc}") from None

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "inbox"
LOGOUT_REDIRECT_URL = "login"

# Single sign-on (OpenID Connect, docs/how-to/sso.md): the identity provider's issuer URL, e.g.
# https://login.example.com/realms/company. Its discovery document names everything else. Empty:
# no single sign-on, passwords only.
GRUNDLAG_OIDC_ISSUER = os.getenv("GRUNDLAG_OIDC_ISSUER", "").strip().rstrip("/")
# The client id this site is registered with at the provider (with GRUNDLAG_OIDC_ISSUER).
OIDC_RP_CLIENT_ID = os.getenv("GRUNDLAG_OIDC_CLIENT_ID", "").strip()
# The client's secret at the provider (with GRUNDLAG_OIDC_ISSUER). Keep it out of the repository.
OIDC_RP_CLIENT_SECRET = os.getenv("GRUNDLAG_OIDC_CLIENT_SECRET", "")
if GRUNDLAG_OIDC_ISSUER and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ImproperlyConfigured(
        "GRUNDLAG_OIDC_ISSUER needs GRUNDLAG_OIDC_CLIENT_ID and GRUNDLAG_OIDC_CLIENT_SECRET"
    )
_issuer = urlsplit(GRUNDLAG_OIDC_ISSUER)
# Plain HTTP only to a provider on this machine (a test's): anywhere else the tokens could be read.
if GRUNDLAG_OIDC_ISSUER and not (
    _issuer.scheme == "https"
    or (_issuer.scheme == "http" and _issuer.hostname in ("127.0.0.1", "localhost", "::1"))
):
    raise ImproperlyConfigured(f"GRUNDLAG_OIDC_ISSUER must be an https:// URL, got {GRUNDLAG_OIDC_ISSUER!r}")
# The ID token's claim that lists the person's groups, which the admin's sign-in groups map to
# teams and roles (Keycloak and Okta: groups; Entra ID: groups, of object ids, or roles).
GRUNDLAG_OIDC_GROUPS_CLAIM = os.getenv("GRUNDLAG_OIDC_GROUPS_CLAIM", "groups").strip() or "groups"
# The scopes asked of the provider (space-separated; openid is needed). Okta sends groups for a
# "groups" scope: add it there.
OIDC_RP_SCOPES = os.getenv("GRUNDLAG_OIDC_SCOPES", "openid email profile").strip()
if GRUNDLAG_OIDC_ISSUER and "openid" not in OIDC_RP_SCOPES.split():
    raise ImproperlyConfigured(f"GRUNDLAG_OIDC_SCOPES must include openid, got {OIDC_RP_SCOPES!r}")
# The algorithm the provider signs ID tokens with (what its discovery lists; RS256 is everyone's).
OIDC_RP_SIGN_ALGO = envchoice(
    "GRUNDLAG_OIDC_SIGN_ALGO", "RS256", {"rs256", "rs384", "rs512", "es256", "es384"}
).upper()
# What the sign-in button says: "Sign in with ...".
GRUNDLAG_OIDC_NAME = os.getenv("GRUNDLAG_OIDC_NAME", "your company account").strip() or "your company account"
# With no sign-in group at all: whether anyone the provider signs in gets an account here (in no
# team, for a team's admin to add). Off, a person must be in a mapped group: a provider that
# accepts anyone (a public Google sign-in) lets nobody in by itself.
GRUNDLAG_OIDC_OPEN_SIGN_UP = envbool("GRUNDLAG_OIDC_OPEN_SIGN_UP", "false")
# Password sign-in on the sign-in page (and the admin's). Off ("false") with single sign-on: staff
# still sign in, with a link made on the server (manage.py signin_link), when the provider is down.
GRUNDLAG_PASSWORD_LOGIN = envbool("GRUNDLAG_PASSWORD_LOGIN", "true")
if not GRUNDLAG_PASSWORD_LOGIN and not GRUNDLAG_OIDC_ISSUER:
    raise ImproperlyConfigured("GRUNDLAG_PASSWORD_LOGIN=false needs single sign-on: set GRUNDLAG_OIDC_ISSUER")
if GRUNDLAG_OIDC_ISSUER:
    # Logging out goes on to the provider's end of the session: a form's redirect to its origin.
    CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(f"{_issuer.scheme}://{_issuer.netloc}")
# mozilla-django-oidc's own (actions.web.sso reads the endpoints from the discovery document).
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # for the provider's logout (id_token_hint)
OIDC_TIMEOUT = 10
OIDC_CREATE_USER = True

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# Session and CSRF cookies go over HTTPS only: on unless DEBUG is. `make run` turns it off, as it
# serves plain HTTP on 127.0.0.1; leave it on wherever the site is reached over HTTPS.
SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", "false" if DEBUG else "true")
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Django's SECURE_HSTS_SECONDS: the max-age of the Strict-Transport-Security header on HTTPS
# responses (behind a proxy, with BEHIND_HTTPS_PROXY), which has browsers use HTTPS only for that
# long; 0: none. Start small: a browser keeps it for the whole max-age.
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "0")
# Behind a proxy that terminates HTTPS: a request it forwards with X-Forwarded-Proto: https counts
# as secure (Django's SECURE_PROXY_SSL_HEADER), for secure cookies, CSRF's origin check and HSTS.
# Only where the proxy sets that header itself, replacing a client's.
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if envbool("BEHIND_HTTPS_PROXY", "false") else None
)
X_FRAME_OPTIONS = "DENY"

# Login throttling (django-axes, actions/web/auth.py): this many failures of one username from one
# client address lock that pair out for a while. Other users, and the same user from elsewhere,
# log in as usual. Attempts and lock-outs are rows in the database (admin: Axes).
GRUNDLAG_LOGIN_ATTEMPTS = envint("GRUNDLAG_LOGIN_ATTEMPTS", "5", minimum=1)
# How long (seconds) such a (username, address) pair stays locked out; the login page says so.
GRUNDLAG_LOGIN_LOCKOUT_SECONDS = envint("GRUNDLAG_LOGIN_LOCKOUT_SECONDS", "900", minimum=1)
# Wider limits with a short cool-off, against spraying (actions/web/auth.py), each counted in
# GRUNDLAG_LOGIN_WINDOW_SECONDS. Failures from one client address (an IPv6 /64), whatever the
# usernames, that pause that address.
GRUNDLAG_LOGIN_ADDRESS_ATTEMPTS = envint("GRUNDLAG_LOGIN_ADDRESS_ATTEMPTS", "30", minimum=1)
# Failures of one username, from any addresses, that pause that username.
GRUNDLAG_LOGIN_USER_ATTEMPTS = envint("GRUNDLAG_LOGIN_USER_ATTEMPTS", "20", minimum=1)
# The window (seconds) those failures are counted in, in the cache: it starts at the first
# failure, and the count ends with it.
GRUNDLAG_LOGIN_WINDOW_SECONDS = envint("GRUNDLAG_LOGIN_WINDOW_SECONDS", "900", minimum=1)
# How long (seconds) an address or a username over its limit is refused, before any password is
# checked; then its count starts again.
GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS = envint("GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS", "60", minimum=1)
AXES_FAILURE_LIMIT = GRUNDLAG_LOGIN_ATTEMPTS
AXES_COOLOFF_TIME = timedelta(seconds=GRUNDLAG_LOGIN_LOCKOUT_SECONDS)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_USERNAME_CALLABLE = "actions.web.auth.login_username"
AXES_CLIENT_IP_CALLABLE = "actions.web.auth.client_ip"
AXES_LOCKOUT_CALLABLE = "actions.web.auth.locked_out"
AXES_VERBOSE = False
# Not a password guess: the identity provider's sign-in, refused (actions.web.sso).
AXES_WHITELIST_CALLABLE = "actions.web.auth.not_a_password"
# Axes looks for its own middleware by name; the site runs a subclass of it, which runs in the
# request's thread (actions.web.middleware.AxesMiddleware), last in MIDDLEWARE as Axes asks: the
# site's own check (grundlag.E001) makes sure of that instead.
SILENCED_SYSTEM_CHECKS = ["axes.W002"]
# The proxies whose X-Forwarded-For names the client (addresses or networks, comma-separated).
# The default trusts a proxy on this machine, as deploy/ sets it up; empty trusts none.
try:
    TRUSTED_PROXY_NETWORKS = [
        ipaddress.ip_network(item, strict=False) for item in envlist("TRUSTED_PROXIES", "127.0.0.1,::1")
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"TRUSTED_PROXIES must list addresses or networks: {exc}") from None
# The throttle's counters live in the cache: shared through Redis when there is one.
CACHES = (
    {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
    if REDIS_URL
    else {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
)

LANGUAGE_CODE = "en-us"
# Django's TIME_ZONE (an IANA name, Europe/Berlin): the zone times are shown in, on pages and in
# messages, and a time given without a zone is read in. Times are stored in UTC whatever it is.
TIME_ZONE = os.getenv("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where `collectstatic` copies the static files (`make run` and the Procfile's release step run
# it), for WhiteNoise to serve.
STATIC_ROOT = Path(os.getenv("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# WhiteNoise serves the files where they are (static/, the apps'), also over what collectstatic
# copied: a stale copy can never shadow a newer file. Set false to serve STATIC_ROOT only.
WHITENOISE_USE_FINDERS = envbool("WHITENOISE_USE_FINDERS", "true")

# Traces of each approval (OpenTelemetry, docs/how-to/traces.md), exported by OTLP/HTTP to this
# collector's URL (http://collector:4318); empty: no traces. The exporter also reads the other
# standard OTEL_* variables (OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER).
OTEL_EXPORTER_OTLP_ENDPOINT = os.getenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
# The collector's URL for traces alone (http://collector:4318/v1/traces), when it differs from
# OTEL_EXPORTER_OTLP_ENDPOINT's; either turns traces on.
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = os.getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
GRUNDLAG_TRACES = bool(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)

# The log's format on stderr: "text" (a line of text an event) or "json" (one JSON object a
# line: time, level, logger, message, and the trace and span ids when traces are on).
GRUNDLAG_LOG_FORMAT = envchoice("GRUNDLAG_LOG_FORMAT", "text", {"text", "json"})

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "actions.tracing.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            **({"formatter": "json"} if GRUNDLAG_LOG_FORMAT == "json" else {}),
        }
    },
    "loggers": {
        # The level of the application's log (the `actions` logger, to stderr): DEBUG, INFO,
        # WARNING, ERROR or CRITICAL. Django's and the libraries' loggers keep their defaults.
        "actions": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO"), "propagate": False}
    },
    # Everything else at WARNING and above, to stderr: a request's unhandled error (Django's
    # `django.request`, its traceback), daphne's and Celery's warnings.
    "root": {"handlers": ["console"], "level": "WARNING"},
}


# Isolation: no token crowds out the others (actions.live.waiting).
# A rate of requests, "N/period", as ninja's throttle parses it; "" (no limit) for "0" or empty.
def envrate(name: str, default: str) -> str:
    import re

    value = os.getenv(name, default).strip()
    if value in ("", "0"):
        return ""
    # What ninja's throttle parses (ninja.throttling.SimpleRateThrottle.parse_rate), counts above 0.
    if not re.fullmatch(r"[1-9][0-9]*/([1-9][0-9]*)?(s|sec|m|min|h|hour|d|day)", value):
        raise ImproperlyConfigured(f'{name} must be a rate such as "600/min" (or 0 for none), got {value!r}')
    return value


# Requests per API token to the API (/api/) and the MCP endpoint (/mcp/), one budget for both:
# "N/period", the period s, sec, m, min, h, hour, d or day, optionally a multiple ("100/10s").
# Over it: 429 with Retry-After. Both take API tokens only, and a request without a valid one is
# refused before it counts. Counted in fixed windows of the period (a burst across a window's
# edge may reach twice the rate), in the cache (CACHES): Redis, shared by every process, when
# REDIS_URL is set; else each process counts its own. "0" or empty: no limit.
GRUNDLAG_API_RATE = envrate("GRUNDLAG_API_RATE", "600/min")
# Requests of one token held waiting at once in a process (`Prefer: wait`, an MCP tool call
# without a task, MCP's tasks/result): past it, a request is answered at once with what is
# there now. Counted per web process: with several, a token holds up to this many in each.
GRUNDLAG_MAX_WAITS_PER_TOKEN = envint("GRUNDLAG_MAX_WAITS_PER_TOKEN", "2", minimum=1)
# MCP's tasks/result holds its answer this long at most for the task to end (keep-alives would
# keep a client's read timeout from ever firing); then it answers that the task is still working.
GRUNDLAG_MCP_RESULT_HOLD_SECONDS = envfloat("GRUNDLAG_MCP_RESULT_HOLD_SECONDS", "60", minimum=0)
# Steps rules' and grants' conditions may take for one step's pauses, all of them together
# (actions.conditions: bounded before it runs, about 0.1 s at most). One that could take more is
# not evaluated: the interrupt is left to people and its event says why. One whose own lists
# already take more is refused when it is saved.
GRUNDLAG_CONDITION_BUDGET = envint("GRUNDLAG_CONDITION_BUDGET", "2000000", minimum=1000)
# Fair share of the step workers (actions.engine.steps): at most this many steps of one team,
# of one API token's runs, and of one team's scripts run at once, wherever they run (counted in
# the database when a worker claims a step). Past it a run waits its turn, queued: it goes on
# when one of its team's steps ends. The defaults leave a quarter of one worker's threads
# (WORKER_CONCURRENCY, the embedded pool's too) to other teams. 0: no limit.
# This one is a team's share: with several workers, size it to their threads together.
GRUNDLAG_TEAM_STEPS = envint("GRUNDLAG_TEAM_STEPS", str(max(1, CELERY_WORKER_CONCURRENCY * 3 // 4)))
# Steps of the runs one API token started, running at once: by default a team's share
# (GRUNDLAG_TEAM_STEPS); lower it so that one client of a team cannot take the team's whole share.
GRUNDLAG_TOKEN_STEPS = envint("GRUNDLAG_TOKEN_STEPS", str(GRUNDLAG_TEAM_STEPS))
# Steps of one team's scripts running at once, each in a sandboxed process of its own: by default
# half of WORKER_CONCURRENCY.
GRUNDLAG_TEAM_SCRIPTS = envint("GRUNDLAG_TEAM_SCRIPTS", str(max(1, CELERY_WORKER_CONCURRENCY // 2)))
# Requests of one API token under way at once in a web process (/api/, /mcp/), held waits
# included; past it 429 with Retry-After: 1, before anything runs (actions.web.middleware).
# 0: no limit.
GRUNDLAG_MAX_REQUESTS_PER_TOKEN = envint("GRUNDLAG_MAX_REQUESTS_PER_TOKEN", "4")
