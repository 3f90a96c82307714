"""Checks of the reconcilers: E015-E017 and W007 (the list and its settings), W010, W014.

W010: a log reconciler whose log cannot be the delivery target's.

``PostfixLogReconciler`` (or a subclass) reads a mail log on the sweeper's
host. When the worker hands its mail over by SMTP to another host, that log
is not the handover's: the reconciler can then settle nothing as "not sent"
(it answers "unknown", see :mod:`outbox.reconcilers.evidence`) and finds
"sent" only by chance. The check names each remote SMTP target: the worker's
default one and each delivery mailer's (``MAILERS`` on Django 6.1, else
``OUTBOX["BACKENDS"]``).

W014: a log reconciler is configured, and a delivery host name resolves to
several addresses: a pool of relays (several A records, a load balancer's
name), each new connection reaching any of them. A relay's log says nothing
about the mail another relay took; the reconciler then rules a handover out
only for rows handed to the server whose log it reads (the row names its
server), and leaves the others for a person.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import warnings
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend
from django.utils.module_loading import import_string

from ..conf import DEFAULTS, outbox_settings
from ..mail.mailers import backend_path, is_delivery_mailer, names, parse_entry
from ..mail.targets import delivery_backend_path, uses_mailers
from ..reconcilers import PostfixLogReconciler, Reconciler
from .settings import outbox_check

POSTFIX_RECONCILER = "outbox.reconcilers.PostfixLogReconciler"
LOCAL_NAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost"})


@outbox_check()
def check_reconcilers(raw: dict[str, Any]) -> list[CheckMessage]:
    """E015 - E017, W007: the reconcilers listed, their numbers, the Postfix log."""
    errors = _check_reconciler_paths(raw.get("RECONCILERS", DEFAULTS["RECONCILERS"]))
    errors += _check_reconcile_numbers()
    paths = raw.get("RECONCILERS") or []
    if isinstance(paths, list | tuple) and POSTFIX_RECONCILER in paths:
        errors += _check_postfix_log()
    return errors


def _check_reconciler_paths(paths: Any) -> list[CheckMessage]:
    if not isinstance(paths, list | tuple) or not all(isinstance(p, str) for p in paths):
        return [
            Error(
                f"OUTBOX['RECONCILERS'] is {paths!r}; it must be a list of dotted paths.",
                hint="For example ['outbox.reconcilers.PostfixLogReconciler'].",
                id="outbox.E015",
            )
        ]
    errors: list[CheckMessage] = []
    for path in paths:
        try:
            found = import_string(path)
        except ImportError as exc:
            errors.append(
                Error(f"OUTBOX['RECONCILERS']: cannot import {path!r}: {exc}", id="outbox.E015")
            )
            continue
        if not (isinstance(found, type) and issubclass(found, Reconciler)):
            errors.append(
                Error(
                    f"OUTBOX['RECONCILERS']: {path!r} is not a subclass of "
                    "outbox.reconcilers.Reconciler.",
                    hint="Name a class that answers answer() or answer_many().",
                    id="outbox.E015",
                )
            )
    return errors


def _check_reconcile_numbers() -> list[CheckMessage]:
    try:
        batch = outbox_settings.RECONCILE_BATCH
        retry = outbox_settings.RECONCILE_RETRY_AFTER
        max_age = outbox_settings.RECONCILE_MAX_AGE
    except (TypeError, ValueError) as exc:
        return [Error(f"An OUTBOX reconcile setting has the wrong type: {exc}", id="outbox.E016")]
    problems = []
    if batch < 1:
        problems.append("RECONCILE_BATCH must be at least 1")
    if not retry > 0:
        problems.append("RECONCILE_RETRY_AFTER must be a positive number of seconds")
    if not max_age > 0:
        problems.append("RECONCILE_MAX_AGE must be a positive number of seconds")
    return [Error(f"OUTBOX: {problem}.", id="outbox.E016") for problem in problems]


def _check_postfix_log() -> list[CheckMessage]:
    path = outbox_settings.POSTFIX_LOG
    if not path:
        return [
            Error(
                "OUTBOX['RECONCILERS'] lists the Postfix log reconciler, but "
                "OUTBOX['POSTFIX_LOG'] is not set.",
                hint="Set it to Postfix's mail log, e.g. '/var/log/mail.log'.",
                id="outbox.E017",
            )
        ]
    if os.access(path, os.R_OK):
        return []
    return [
        Warning(
            f"OUTBOX['POSTFIX_LOG'] is {path!r}, which this host cannot read; the Postfix "
            "reconciler will answer 'unknown' here.",
            hint="Run the sweeper where the mail log is, as a user that may read it "
            "(on Debian, a member of the 'adm' group).",
            id="outbox.W007",
        )
    ]


@outbox_check()
def check_log_reconciler_targets(raw: dict[str, Any]) -> list[CheckMessage]:
    """W010: a log reconciler is configured, but the worker delivers by SMTP to another host."""
    readers = _log_reconcilers()
    if not readers:
        return []
    remote = sorted(
        {f"{target} ({host})" for target, host in _smtp_targets() if not is_local(host)}
    )
    if not remote:
        return []
    return [
        Warning(
            f"OUTBOX['RECONCILERS'] lists {', '.join(readers)}, which reads this host's mail "
            f"log, but the worker hands mail over by SMTP to another host: {'; '.join(remote)}. "
            "That log is not the one of the server that took the message: such rows are "
            "left for a person.",
            hint="Deliver through the local Postfix (SMTP to localhost or sendmail), or run "
            "the sweeper with the reconciler on the relay host, reading its log.",
            id="outbox.W010",
        )
    ]


@outbox_check()
def check_log_reconciler_pool(raw: dict[str, Any]) -> list[CheckMessage]:
    """W014: a log reconciler is configured and a delivery host name names several addresses."""
    readers = _log_reconcilers()
    if not readers:
        return []
    pools = []
    for target, host in sorted(set(_smtp_targets())):
        found = addresses(host)
        if len(found) > 1 and not all(is_local(a) for a in found):  # localhost: one host
            pools.append(f"{target}: {host} ({', '.join(found)})")
    if not pools:
        return []
    return [
        Warning(
            f"OUTBOX['RECONCILERS'] lists {', '.join(readers)}, and the worker's delivery host "
            f"name resolves to several addresses: {'; '.join(pools)}. Each new connection may "
            "reach another relay, whose log is another: 'not sent' is settled only for rows "
            "handed to the server whose log is read; the others are left for a person.",
            hint="Point the delivery host at one relay per worker, or run a sweeper with "
            "the reconciler on each relay, reading its own log.",
            id="outbox.W014",
        )
    ]


def addresses(host: str) -> list[str]:
    """The distinct addresses ``host`` resolves to; none if it does not resolve."""
    name = host.strip().strip("[]")
    if not name:
        return []
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # does not resolve: not this check's business
        return []
    return sorted({str(info[4][0]) for info in infos})


def _log_reconcilers() -> list[str]:
    """The configured reconcilers that read a local mail log (unimportable ones: E015)."""
    paths = outbox_settings.user_settings.get("RECONCILERS")
    if not isinstance(paths, list | tuple):
        return []
    found = []
    for path in paths:
        try:
            cls = import_string(str(path))
        except Exception:  # outbox.E015 says why
            continue
        if isinstance(cls, type) and issubclass(cls, PostfixLogReconciler):
            found.append(str(path))
    return found


def _smtp_targets() -> Iterator[tuple[str, str]]:
    """(what, host) of each SMTP target the worker may deliver to."""
    try:
        default_path = delivery_backend_path()
    except Exception:  # outbox.E007 says why
        default_path = ""
    if _is_smtp(default_path):
        yield "the worker's default target", _host(_default_options())
    default_alias = outbox_settings.MAILER or "default"
    for alias in names():
        if not is_delivery_mailer(alias) or (alias == default_alias and not _default_is_setting()):
            continue  # the outbox itself, or the default target, named above
        try:
            path, options = backend_path(alias), _mailer_options(alias)
        except Exception:  # a malformed entry: outbox.E012
            continue
        if _is_smtp(path):
            yield f"mailer {alias!r}", _host(options)


def _default_is_setting() -> bool:
    """Whether the default target is configured by settings, not by a MAILERS entry."""
    return bool(outbox_settings.EMAIL_BACKEND) or not uses_mailers()


def _default_options() -> dict[str, Any]:
    """The OPTIONS of the worker's default target: a MAILERS entry's, or none (settings)."""
    if _default_is_setting():
        return {}
    alias = outbox_settings.MAILER or "default"
    return dict(getattr(settings, "MAILERS", {}).get(alias, {}).get("OPTIONS", {}))


def _mailer_options(alias: str) -> dict[str, Any]:
    if uses_mailers():
        return dict(getattr(settings, "MAILERS", {})[alias].get("OPTIONS", {}))
    return parse_entry(alias, outbox_settings.BACKENDS[alias])[1]


def _is_smtp(path: str) -> bool:
    try:
        cls = import_string(path) if path else None
    except Exception:
        return False
    return isinstance(cls, type) and issubclass(cls, SMTPBackend)


def _host(options: dict[str, Any]) -> str:
    if "host" in options:
        return str(options["host"] or "")
    with warnings.catch_warnings():
        # Django 6.1 warns on any read of the deprecated EMAIL_* settings.
        warnings.simplefilter("ignore")
        return str(getattr(settings, "EMAIL_HOST", "localhost") or "")


def is_local(host: str) -> bool:
    """Loopback, localhost or this host's own name: its mail log is this host's."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    own = socket.gethostname().lower()
    return name in (own, own.split(".", 1)[0])
