"""System checks, and a warning-free start of the test and example projects."""

from __future__ import annotations

import os
import subprocess
import sys

import django
import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from outbox.backends import OutboxBackend
from outbox.checks.mailers import check_silent_delivery
from outbox.checks.redis import check_redis_eviction
from outbox.conf import outbox_settings
from outbox.mail.targets import HAS_MAILERS
from outbox.queue import get_connection
from tests.checking import outbox_checks
from tests.paths import ROOT
from tests.servers import free_port

OUTBOX_BACKEND = "outbox.backends.OutboxBackend"
SMTP = "django.core.mail.backends.smtp.EmailBackend"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"

pytestmark = pytest.mark.filterwarnings(
    "error::DeprecationWarning", "error::PendingDeprecationWarning"
)

only_52 = pytest.mark.skipif(HAS_MAILERS, reason="EMAIL_BACKEND configuration (Django < 6.1)")
only_61 = pytest.mark.skipif(not HAS_MAILERS, reason="MAILERS needs Django 6.1")


class SubOutbox(OutboxBackend):
    """A project's own subclass is still the outbox."""


def ids() -> list[str]:
    return [message.id for message in outbox_checks()]


def outbox(settings, **values) -> None:
    """settings.OUTBOX with ``values``; a value of None removes the key."""
    merged = {**settings.OUTBOX, **values}
    settings.OUTBOX = {k: v for k, v in merged.items() if v is not None}


def test_the_test_settings_pass():
    assert outbox_checks() == []


def test_outbox_must_be_a_dict(settings):
    settings.OUTBOX = ["REDIS_CACHE"]
    assert ids() == ["outbox.E001"]


def test_unknown_key(settings):
    outbox(settings, COLOUR="blue")
    [warning] = outbox_checks()
    assert warning.id == "outbox.W001" and "COLOUR" in warning.msg


@pytest.mark.parametrize("value", [True, False])
def test_a_retired_key_says_it_is_no_longer_used(settings, value):
    # Not "unknown": the project set it on purpose, and should learn why it went.
    outbox(settings, POSTGRESQL_FUNCTIONS=value)
    [warning] = outbox_checks()
    assert warning.id == "outbox.W001"
    assert warning.msg == (
        "OUTBOX: POSTGRESQL_FUNCTIONS is no longer used: "
        "the PostgreSQL functions are always on (remove it)."
    )


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("ALLOWED_RECIPIENT", "ALLOWED_RECIPIENTS"),
        ("allowed_recipients", "ALLOWED_RECIPIENTS"),
        ("REDIRECT", "REDIRECT_TO"),
        ("MAX_ATTEMPT", "MAX_ATTEMPTS"),
    ],
)
def test_a_misspelt_key_is_an_error_naming_both(settings, key, meant):
    outbox(settings, **{key: ["*@example.com"]})
    [error] = outbox_checks()
    assert error.id == "outbox.E026"
    assert error.msg == f"OUTBOX: {key} is not a setting; did you mean {meant}?"


@pytest.mark.django_db  # the model checks may ask the database what it supports
def test_the_worker_refuses_to_start_on_a_misspelt_safety_setting(settings):
    # A staging site whose valve is misspelt would send to real customers.
    outbox(settings, ALLOWED_RECIPIENT=["*@example.com"], REDIRECT_TO="qa@example.com")
    with pytest.raises(SystemCheckError, match=r"outbox\.E026.*did you mean ALLOWED_RECIPIENTS"):
        call_command("outbox_worker", "--burst", skip_checks=False)


def test_a_misspelt_key_and_an_unknown_one_are_each_reported(settings):
    outbox(settings, ALLOWED_RECIPIENT=[], COLOUR="blue")
    assert sorted(ids()) == ["outbox.E026", "outbox.W001"]


def test_missing_cache_alias(settings):
    outbox(settings, REDIS_CACHE="queue")
    [error] = outbox_checks()
    assert error.id == "outbox.E002" and "'queue'" in error.msg


def test_cache_that_is_not_django_redis(settings):
    settings.CACHES = {
        **settings.CACHES,
        "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    outbox(settings, REDIS_CACHE="local")
    [error] = outbox_checks()
    assert error.id == "outbox.E003" and "django-redis" in error.msg


def test_bad_abandoned_policy(settings):
    outbox(settings, ABANDONED_POLICY="retry")
    assert ids() == ["outbox.E004"]


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"RETRY_BACKOFF": (60, 10)}, "RETRY_BACKOFF"),
        ({"RETRY_BACKOFF": (0, 10)}, "RETRY_BACKOFF"),
        ({"HEARTBEAT_INTERVAL": 30, "HEARTBEAT_TIMEOUT": 30}, "HEARTBEAT_INTERVAL"),
        ({"CLAIM_BATCH": 0}, "CLAIM_BATCH"),
        ({"BLOCK_TIMEOUT": 0}, "BLOCK_TIMEOUT"),
        ({"BLOCK_TIMEOUT": 60}, "BLOCK_TIMEOUT"),
        ({"MIRROR_FULL_SCAN_INTERVAL": 0}, "MIRROR_FULL_SCAN_INTERVAL"),
        ({"FAILURE_ALARM_WINDOW": 0.5}, "FAILURE_ALARM_WINDOW must be from 1 to 86400"),
        ({"FAILURE_ALARM_WINDOW": float("nan")}, "FAILURE_ALARM_WINDOW"),
        ({"FAILURE_ALARM_MIN": 0}, "FAILURE_ALARM_MIN must be at least 1"),
        ({"FAILURE_ALARM_SHARE": 0}, "FAILURE_ALARM_SHARE must be above 0 and at most 1"),
        ({"FAILURE_ALARM_SHARE": 1.5}, "FAILURE_ALARM_SHARE"),
    ],
)
def test_numbers(settings, values, fragment):
    outbox(settings, **values)
    [error] = outbox_checks()
    assert error.id == "outbox.E005" and fragment in error.msg


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("MAX_ATTEMPTS", "five", "OUTBOX['MAX_ATTEMPTS'] = 'five': expected an integer."),
        ("MAX_ATTEMPTS", 2.5, "OUTBOX['MAX_ATTEMPTS'] = 2.5: expected an integer."),
        ("MAX_ATTEMPTS", "5", "OUTBOX['MAX_ATTEMPTS'] = '5': expected an integer."),
        ("CLAIM_BATCH", True, "OUTBOX['CLAIM_BATCH'] = True: expected an integer."),
        ("HEARTBEAT_TIMEOUT", "30", "OUTBOX['HEARTBEAT_TIMEOUT'] = '30': expected a number."),
        ("BLOCK_TIMEOUT", None, "OUTBOX['BLOCK_TIMEOUT'] = None: expected a number."),
        ("FAILURE_ALARM_MIN", 2.5, "OUTBOX['FAILURE_ALARM_MIN'] = 2.5: expected an integer."),
        (
            "FAILURE_ALARM_WINDOW",
            "60",
            "OUTBOX['FAILURE_ALARM_WINDOW'] = '60': expected a number.",
        ),
        (
            "RETRY_BACKOFF",
            10,
            "OUTBOX['RETRY_BACKOFF'] = 10: expected a pair of numbers (base, cap).",
        ),
        (
            "RETRY_BACKOFF",
            ("10", 60),
            "OUTBOX['RETRY_BACKOFF'] = ('10', 60): expected a pair of numbers (base, cap).",
        ),
    ],
)
def test_a_number_of_the_wrong_type_names_key_value_and_type(settings, key, value, message):
    settings.OUTBOX = {**settings.OUTBOX, key: value}  # None too (outbox() would drop it)
    [error] = outbox_checks()
    assert (error.id, error.msg) == ("outbox.E005", message)


@pytest.mark.parametrize("value", ["5", 2.5, True])
def test_what_e005_refuses_is_not_read_either(settings, value):
    # The settings are read live: a value the check refuses is refused where
    # it is read, not coerced (int(2.5) would silently be 2).
    outbox(settings, MAX_ATTEMPTS=value)
    with pytest.raises(ImproperlyConfigured, match="expected an integer"):
        _ = outbox_settings.MAX_ATTEMPTS


def test_two_numbers_of_the_wrong_type_are_both_named(settings):
    outbox(settings, MAX_ATTEMPTS="five", CLAIM_BATCH=2.5)
    assert sorted(m.msg for m in outbox_checks()) == [
        "OUTBOX['CLAIM_BATCH'] = 2.5: expected an integer.",
        "OUTBOX['MAX_ATTEMPTS'] = 'five': expected an integer.",
    ]


def test_key_prefix(settings):
    outbox(settings, KEY_PREFIX="{outbox}")
    assert ids() == ["outbox.E006"]


def test_delivery_backend_that_cannot_be_imported(settings):
    outbox(settings, EMAIL_BACKEND="no.such.Backend")
    assert "outbox.E007" in ids()


# -- E008: the worker must not deliver into the outbox ---------------------------------


@only_52
def test_e008_email_backend_is_the_outbox_and_no_delivery_backend(settings):
    settings.EMAIL_BACKEND = OUTBOX_BACKEND
    outbox(settings, EMAIL_BACKEND=None)
    [error] = outbox_checks()
    assert error.id == "outbox.E008"
    assert "EMAIL_BACKEND is outbox.backends.OutboxBackend" in error.msg


@only_52
def test_email_backend_is_the_outbox_with_a_delivery_backend(settings):
    settings.EMAIL_BACKEND = OUTBOX_BACKEND
    outbox(settings, EMAIL_BACKEND=SMTP)
    assert outbox_checks() == []


@only_52
def test_mailer_setting_is_ignored_before_mailers(settings):
    outbox(settings, MAILER="smtp")
    assert ids() == ["outbox.W002"]


@pytest.mark.parametrize("backend", [OUTBOX_BACKEND, "tests.checks.test_settings.SubOutbox"])
def test_e008_delivery_backend_is_the_outbox(settings, backend):
    outbox(settings, EMAIL_BACKEND=backend)
    assert "outbox.E008" in ids()


@only_61
def test_e008_default_mailer_is_the_outbox_and_no_mailer_chosen(settings):
    settings.MAILERS = {"default": {"BACKEND": OUTBOX_BACKEND}}
    outbox(settings, MAILER=None, EMAIL_BACKEND=None)
    [error] = outbox_checks()
    assert error.id == "outbox.E008"
    assert "the mailer 'default'" in error.msg


@only_61
def test_default_mailer_is_the_outbox_and_the_worker_uses_smtp(settings):
    settings.MAILERS = {
        "default": {"BACKEND": OUTBOX_BACKEND},
        "smtp": {"OPTIONS": {"host": "smtp.example.com"}},
    }
    outbox(settings, MAILER="smtp", EMAIL_BACKEND=None)
    assert outbox_checks() == []


@only_61
def test_e008_chosen_mailer_is_the_outbox(settings):
    settings.MAILERS = {
        "default": {"BACKEND": SMTP, "OPTIONS": {"host": "smtp.example.com"}},
        "queued": {"BACKEND": "tests.checks.test_settings.SubOutbox"},
    }
    outbox(settings, MAILER="queued", EMAIL_BACKEND=None)
    assert ids() == ["outbox.E008"]


@only_61
def test_e007_chosen_mailer_is_missing(settings):
    settings.MAILERS = {"default": {"BACKEND": OUTBOX_BACKEND}}
    outbox(settings, MAILER="smtp", EMAIL_BACKEND=None)
    [error] = outbox_checks()
    assert error.id == "outbox.E007" and "'smtp'" in error.msg


@only_61
def test_w003_dotted_path_with_mailers(settings):
    outbox(settings, EMAIL_BACKEND=LOCMEM, MAILER=None)
    assert ids() == ["outbox.W003"]


@only_61
def test_e008_on_61_without_mailers(settings):
    """A 6.1 project not yet migrated to MAILERS: EMAIL_BACKEND is still read."""
    from django.conf import settings as django_settings
    from django.test import override_settings
    from django.utils.deprecation import RemovedInDjango2028Warning

    # By hand rather than with the settings fixture, whose clean-up would read
    # the deprecated setting again from outside Django (and warn).
    override = override_settings(OUTBOX={**settings.OUTBOX, "MAILER": None})
    override.enable()
    try:
        del django_settings.MAILERS
        with pytest.warns(RemovedInDjango2028Warning, match="EMAIL_BACKEND setting is deprecated"):
            django_settings.EMAIL_BACKEND = OUTBOX_BACKEND
        assert ids() == ["outbox.E008"]
        django_settings.OUTBOX = {**django_settings.OUTBOX, "EMAIL_BACKEND": LOCMEM}
        assert outbox_checks() == []
    finally:
        override.disable()


# -- `python -W error -m django check`: no warning on this Django version -------------------


@pytest.mark.parametrize("module", ["tests.settings", "example_project.settings"])
def test_django_check_starts_without_warnings(module, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["DJANGO_SETTINGS_MODULE"] = module
    # The example's database is a file; without this it would be example.sqlite3 at the top.
    env["EXAMPLE_DB_PATH"] = str(tmp_path / "example.sqlite3")
    # The suite's Redis, or outbox.W013 would say the example's is not running.
    env["REDIS_URL"] = django_settings.CACHES["default"]["LOCATION"]
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "django", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    assert result.stderr == ""
    version = subprocess.run(
        [sys.executable, "-c", "import django; print(django.get_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == django.get_version()  # the Django of this cell


# -- Redis Cluster and Sentinel caches (outbox.E018, E019) -----------------------------

CLUSTER = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"],
    "OPTIONS": {"CLIENT_CLASS": "outbox.redis_cluster.ClusterClient"},
}
SENTINEL = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": "redis://mymaster/0",
    "OPTIONS": {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
        "SENTINELS": [("127.0.0.1", 26379)],
    },
}


def test_a_cluster_cache_passes(settings):
    settings.CACHES = {**settings.CACHES, "default": CLUSTER}
    # Only W013: no cluster listens there (a cluster is tested in tests/faults/test_redis_failover.py).
    [warning] = outbox_checks()
    assert warning.id == "outbox.W013"
    assert "redis://127.0.0.1:7000, redis://127.0.0.1:7001" in warning.msg


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        (["redis://127.0.0.1:7000/2"], "database 0"),
        (["unix:///run/redis.sock"], "redis://host:port"),
        ("redis://127.0.0.1:7000,127.0.0.1:7001", "redis://host:port"),
        ([], "names no node"),
    ],
)
def test_e018_cluster_location(settings, location, fragment):
    settings.CACHES = {**settings.CACHES, "default": {**CLUSTER, "LOCATION": location}}
    [error] = outbox_checks()
    assert error.id == "outbox.E018" and fragment in error.msg


def test_a_sentinel_cache_passes(settings):
    settings.CACHES = {**settings.CACHES, "default": SENTINEL}
    [warning] = outbox_checks()  # only W013: no Sentinel listens there
    assert warning.id == "outbox.W013"
    assert "redis://mymaster/0 through Sentinels 127.0.0.1:26379" in warning.msg


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"CONNECTION_FACTORY": None}, "SentinelConnectionFactory"),
        ({"SENTINELS": None}, "(host, port)"),
        ({"SENTINELS": ["127.0.0.1:26379"]}, "(host, port)"),
    ],
)
def test_e019_sentinel_options(settings, options, fragment):
    merged = {k: v for k, v in {**SENTINEL["OPTIONS"], **options}.items() if v is not None}
    settings.CACHES = {**settings.CACHES, "default": {**SENTINEL, "OPTIONS": merged}}
    [error] = outbox_checks()
    assert error.id == "outbox.E019" and fragment in error.msg


def silent_warnings() -> list[str]:
    return [m.msg for m in check_silent_delivery() if m.id == "outbox.W011"]


def test_w011_fail_silently_on_a_delivery_backend_is_reported_as_ignored(settings):
    silent = {"BACKEND": SMTP, "OPTIONS": {"host": "localhost", "fail_silently": True}}
    if HAS_MAILERS:
        settings.MAILERS = {**settings.MAILERS, "bulk": silent, "quiet": {**silent}}
        settings.MAILERS["quiet"]["OPTIONS"] = {"fail_silently": False}
    else:
        outbox(settings, BACKENDS={"bulk": silent, "quiet": SMTP})
    [message] = silent_warnings()
    assert "'bulk'" in message and "ignores it" in message


def test_w011_not_for_the_outbox_backend_itself(settings):
    if not HAS_MAILERS:
        pytest.skip("MAILERS needs Django 6.1")
    settings.MAILERS = {
        **settings.MAILERS,
        "default": {"BACKEND": OUTBOX_BACKEND, "OPTIONS": {"fail_silently": True}},
    }
    assert silent_warnings() == []


# -- outbox.E021: an evicting Redis (asks the suite's real redis-server) ----------------


def deploy_ids() -> list[str]:
    return [m.id for m in outbox_checks(deploy=True)]


@pytest.fixture
def maxmemory_policy():
    """Set the redis-server's maxmemory-policy for one test, then restore it."""
    client = get_connection()
    before = client.config_get("maxmemory-policy")["maxmemory-policy"]
    yield lambda policy: client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory-policy", before)


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_e021_a_redis_that_may_evict_any_key(maxmemory_policy, policy):
    maxmemory_policy(policy)
    assert deploy_ids() == ["outbox.E021"]
    [error] = check_redis_eviction()
    assert policy in error.msg and "noeviction" in error.hint
    assert "outbox.E021" not in [m.id for m in outbox_checks()]  # deploy checks only


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-ttl"])
def test_no_e021_for_a_policy_that_spares_the_outbox_keys(maxmemory_policy, policy):
    maxmemory_policy(policy)
    assert check_redis_eviction() == []


def test_no_e021_when_redis_cannot_be_asked(settings, maxmemory_policy):
    maxmemory_policy("allkeys-lru")  # the suite's server would be reported; this one is away
    settings.CACHES = {
        **settings.CACHES,
        "away": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        },
    }
    outbox(settings, REDIS_CACHE="away")
    assert check_redis_eviction() == []


# -- outbox.W013: the outbox's Redis does not answer ----------------------------------------


def away_cache(settings, **options) -> str:
    """Point the outbox at a Redis that is not running; returns its URL."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    settings.CACHES = {
        **settings.CACHES,
        "away": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1, **options},
        },
    }
    outbox(settings, REDIS_CACHE="away")
    return url


@pytest.mark.parametrize("deploy", [False, True])
def test_w013_an_unreachable_redis_is_a_warning_naming_its_address(settings, deploy):
    url = away_cache(settings)
    [warning] = outbox_checks(deploy=deploy)
    assert warning.id == "outbox.W013" and warning.level == checks.WARNING
    assert f"The outbox's Redis (cache 'away' at {url}) is unreachable: ConnectionError" in (
        warning.msg
    )


def test_w013_hides_a_password_in_the_address(settings):
    url = away_cache(settings)
    settings.CACHES["away"]["LOCATION"] = url.replace("//", "//user:secret@")
    [warning] = outbox_checks()
    assert "secret" not in warning.msg and "//user:***@127.0.0.1:" in warning.msg
