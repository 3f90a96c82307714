"""outbox.W010: a log reconciler while the worker hands mail over by SMTP to another host.

outbox.W014: a log reconciler while a delivery host name resolves to several addresses.
"""

from __future__ import annotations

import socket

import pytest

from outbox.checks.reconcilers import (
    addresses,
    check_log_reconciler_pool,
    check_log_reconciler_targets,
    is_local,
)
from outbox.mail.targets import HAS_MAILERS
from outbox.reconcilers import PostfixLogReconciler
from tests.checking import outbox_checks

SMTP = "django.core.mail.backends.smtp.EmailBackend"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
OUTBOX_BACKEND = "outbox.backends.OutboxBackend"
POSTFIX = "outbox.reconcilers.PostfixLogReconciler"

pytestmark = pytest.mark.filterwarnings(
    "error::DeprecationWarning", "error::PendingDeprecationWarning"
)


class MyPostfix(PostfixLogReconciler):
    """A project's own subclass still reads a local log."""


def warnings_() -> list[str]:
    return [m.msg for m in check_log_reconciler_targets() if m.id == "outbox.W010"]


def configure(settings, host: str | None, *, reconciler: str = POSTFIX, mailers=None) -> None:
    """The worker's default target: SMTP to ``host`` (None: locmem); ``mailers``: alias -> entry."""
    settings.OUTBOX = {**settings.OUTBOX, "RECONCILERS": [reconciler], "POSTFIX_LOG": "/x"}
    default = {"BACKEND": SMTP, "OPTIONS": {"host": host}} if host is not None else LOCMEM
    if HAS_MAILERS:
        delivery = default if isinstance(default, dict) else {"BACKEND": default}
        settings.MAILERS = {
            "default": {"BACKEND": OUTBOX_BACKEND},
            "delivery": delivery,
            **(mailers or {}),
        }
    else:
        settings.OUTBOX = {
            **settings.OUTBOX,
            "EMAIL_BACKEND": SMTP if host is not None else LOCMEM,
            "BACKENDS": mailers or {},
        }
        settings.EMAIL_HOST = host or "localhost"


@pytest.mark.parametrize(
    "host",
    ["localhost", "LOCALHOST.", "127.0.0.1", "127.0.1.1", "::1", "[::1]", "", "mx.localhost"],
)
def test_loopback_and_localhost_are_local(host):
    assert is_local(host)


def test_this_hosts_own_name_is_local():
    name = socket.gethostname()
    assert is_local(name) and is_local(name.split(".")[0].upper())


@pytest.mark.parametrize("host", ["smtp.example.com", "10.0.0.5", "2001:db8::1", "relay-42"])
def test_other_hosts_are_not_local(host):
    assert not is_local(host)


def test_a_remote_default_target_warns(settings):
    configure(settings, "smtp.example.com")
    [message] = warnings_()
    assert "smtp.example.com" in message and "default target" in message and POSTFIX in message


def test_a_local_default_target_does_not_warn(settings):
    configure(settings, "127.0.0.1")
    assert warnings_() == []


def test_a_subclass_counts_as_a_log_reconciler(settings):
    configure(settings, "smtp.example.com", reconciler="tests.checks.test_reconcilers.MyPostfix")
    [message] = warnings_()
    assert "MyPostfix" in message


def test_without_a_log_reconciler_nothing_warns(settings):
    configure(settings, "smtp.example.com", reconciler="tests.sweeper.test_reconcile.Scripted")
    assert warnings_() == []
    settings.OUTBOX = {**settings.OUTBOX, "RECONCILERS": []}
    assert warnings_() == []


def test_a_remote_mailer_warns_by_name(settings):
    relay = {"BACKEND": SMTP, "OPTIONS": {"host": "relay.example.net", "port": 587}}
    configure(settings, "localhost", mailers={"bulk": relay, "test": {"BACKEND": LOCMEM}})
    [message] = warnings_()
    assert "mailer 'bulk' (relay.example.net)" in message and "default target" not in message


def test_a_backend_that_is_not_smtp_does_not_warn(settings):
    configure(settings, None)
    assert warnings_() == []


def test_the_check_is_registered(settings):
    configure(settings, "smtp.example.com")
    # Registered with Django's checks (only the outbox's are run: the model
    # checks would need the database on SQLite).
    assert "outbox.W010" in [m.id for m in outbox_checks()]


# -- W014: one host name, several relays -----------------------------------------------


def pool_warnings() -> list[str]:
    return [m.msg for m in check_log_reconciler_pool() if m.id == "outbox.W014"]


@pytest.fixture
def dns(monkeypatch):
    """Names that resolve to the addresses given; the rest as this host resolves them."""
    names: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in names:
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port or 0)) for ip in names[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names


def test_a_delivery_host_with_several_addresses_warns(settings, dns):
    dns["relays.example.com"] = ["192.0.2.10", "192.0.2.11"]
    configure(settings, "relays.example.com")
    [message] = pool_warnings()
    assert "relays.example.com (192.0.2.10, 192.0.2.11)" in message and POSTFIX in message


def test_a_mailers_pool_warns_too(settings, dns):
    dns["bulk.example.com"] = ["192.0.2.20", "192.0.2.21", "192.0.2.20"]
    configure(
        settings,
        "127.0.0.1",
        mailers={"bulk": {"BACKEND": SMTP, "OPTIONS": {"host": "bulk.example.com"}}},
    )
    [message] = pool_warnings()
    assert "mailer 'bulk'" in message and "(192.0.2.20, 192.0.2.21)" in message


def test_one_address_no_reconciler_or_loopback_does_not_warn(settings, dns):
    dns["one.example.com"] = ["192.0.2.30"]
    dns["relays.example.com"] = ["192.0.2.10", "192.0.2.11"]
    dns["localhost"] = ["127.0.0.1", "::1"]
    configure(settings, "one.example.com")
    assert pool_warnings() == []
    configure(settings, "localhost")
    assert pool_warnings() == []
    configure(settings, "relays.example.com", reconciler="tests.sweeper.test_reconcile.Scripted")
    assert pool_warnings() == []


def test_a_name_that_does_not_resolve_is_not_this_checks_business(settings):
    assert addresses("no-such-relay.invalid") == []
    configure(settings, "no-such-relay.invalid")
    assert pool_warnings() == []
