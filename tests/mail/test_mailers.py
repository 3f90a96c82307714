"""A mailer per email (outbox/mail/mailers.py): ``enqueue_email(..., mailer="bulk")``.

Two real SMTP servers on loopback stand for two mail services: the worker's
default target, and the ``"bulk"`` mailer (an alias of ``MAILERS`` on Django
6.1, a key of ``OUTBOX["BACKENDS"]`` on 5.2). The worker runs in this
process, as tests/worker/test_loop.py runs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured, ValidationError

from outbox import enqueue_email, enqueue_many, enqueue_template
from outbox.backends import OutboxBackend
from outbox.mail.mailers import delivery_mailers, get_connection, is_delivery_mailer
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Attempt, Delivery, Email, EmailTemplate
from outbox.queue import ratelimit
from outbox.worker import Worker
from tests.checking import outbox_checks
from tests.delivery import SMTP, use_smtp
from tests.servers import SMTPRecorder, sample_message, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"


def add_mailer(settings, alias: str, backend: str, options: dict[str, Any] | None = None) -> None:
    """Make ``alias`` a mailer, as a project on this Django version would."""
    entry = {"BACKEND": backend, "OPTIONS": options or {}}
    if HAS_MAILERS:
        settings.MAILERS = {**settings.MAILERS, alias: entry}
    else:
        backends = {**settings.OUTBOX.get("BACKENDS", {}), alias: entry}
        settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": backends}


def remove_mailer(settings, alias: str) -> None:
    if HAS_MAILERS:
        settings.MAILERS = {k: v for k, v in settings.MAILERS.items() if k != alias}
    else:
        backends = {k: v for k, v in settings.OUTBOX.get("BACKENDS", {}).items() if k != alias}
        settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": backends}


def two_servers(settings, default: SMTPRecorder, bulk: SMTPRecorder, **outbox: Any) -> None:
    """The worker's default target is ``default``; the mailer "bulk" is ``bulk``."""
    use_smtp(settings, default.port, **outbox)
    add_mailer(settings, "bulk", SMTP, {"host": "127.0.0.1", "port": bulk.port})


class PeerRecorder(SMTPRecorder):
    """An SMTPRecorder that also notes each message's client address (one per connection)."""

    peers: list[Any]

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.peers = [*getattr(self, "peers", []), session.peer]
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def default_server() -> Iterator[PeerRecorder]:
    server = PeerRecorder().start()
    yield server
    server.stop()


@pytest.fixture
def bulk_server() -> Iterator[PeerRecorder]:
    server = PeerRecorder().start()
    yield server
    server.stop()


def burst(**kwargs: Any) -> Worker:
    worker = Worker(burst=True, **kwargs)
    assert worker.run(install_signal_handlers=False) == 0
    return worker


def recipients(server: SMTPRecorder) -> list[str]:
    return sorted(r for item in server.received for r in item.rcpt_tos)


def counts() -> tuple[int, int]:
    return Email.objects.count(), Delivery.objects.count()


# -- the worker delivers each email through its mailer ---------------------------------


def test_each_email_arrives_through_its_own_mailer(settings, default_server, bulk_server):
    two_servers(settings, default_server, bulk_server)
    EmailTemplate.objects.create(name="news", subject="News {{ n }}", text="Hello {{ n }}")
    plain = enqueue_email("Receipt", "b", None, ["r1@example.com", "r2@example.com"])
    bulk = enqueue_email("Offer", "b", None, ["b1@example.com", "b2@example.com"], mailer="bulk")
    templated = enqueue_template("news", {"n": 1}, None, ["t1@example.com"], mailer="bulk")
    many = enqueue_many(
        [
            {"subject": "m", "message": "b", "recipient_list": ["m1@example.com"]},
            {
                "subject": "m",
                "message": "b",
                "recipient_list": ["m2@example.com"],
                "mailer": "bulk",
            },
            {
                "template": "news",
                "context": {"n": 2},
                "recipient_list": ["m3@example.com"],
                "mailer": "bulk",
            },
        ]
    )
    assert {d.email.mailer for d in bulk + templated} == {"bulk"}
    assert [Email.objects.get(pk=d[0].email_id).mailer for d in many] == ["", "bulk", "bulk"]

    burst(concurrency=2)

    assert recipients(default_server) == ["m1@example.com", "r1@example.com", "r2@example.com"]
    assert recipients(bulk_server) == [
        "b1@example.com",
        "b2@example.com",
        "m2@example.com",
        "m3@example.com",
        "t1@example.com",
    ]
    rows = [*plain, *bulk, *templated, *(d for item in many for d in item)]
    assert Delivery.objects.filter(pk__in=[d.pk for d in rows], status=Status.SENT).count() == 8
    assert not Attempt.objects.exists()


def test_a_thread_keeps_one_open_connection_per_mailer(settings, default_server, bulk_server):
    two_servers(settings, default_server, bulk_server)
    for i in range(6):  # interleaved: the thread switches mailer at every email
        enqueue_email("d", "b", None, [f"d{i}@example.com"])
        enqueue_email("b", "b", None, [f"b{i}@example.com"], mailer="bulk")

    burst(concurrency=1)

    assert default_server.count() == 6 and bulk_server.count() == 6
    # Each server saw every message on one connection: switching mailers
    # neither closed the other connection nor opened a new one per email.
    assert len(set(default_server.peers)) == 1
    assert len(set(bulk_server.peers)) == 1


def test_a_mailer_the_worker_host_does_not_know_fails_the_attempt(
    settings, default_server, bulk_server
):
    two_servers(settings, default_server, bulk_server)
    [row] = enqueue_email("b", "b", None, ["b@example.com"], mailer="bulk", max_attempts=1)
    [other] = enqueue_email("d", "b", None, ["d@example.com"])
    remove_mailer(settings, "bulk")  # the worker's settings differ from the web host's

    burst()

    row.refresh_from_db()
    assert row.status == Status.FAILED
    # An ImproperlyConfigured of its own: the mailer is not paused for the hosts that know it.
    assert "UnknownMailerError" in row.last_error and "'bulk'" in row.last_error
    assert Attempt.objects.filter(delivery=row).count() == 1
    # Never sent through the default target instead.
    assert recipients(default_server) == ["d@example.com"]
    assert bulk_server.count() == 0
    other.refresh_from_db()
    assert other.status == Status.SENT


def test_an_answer_lost_after_the_body_is_in_doubt_on_a_mailer_too(settings, default_server):
    cutting = SMTPRecorder(after_data="cut").start()
    try:
        two_servers(settings, default_server, cutting, SEND_TIMEOUT=5.0, ABANDONED_POLICY="review")
        [row] = enqueue_email("b", "b", None, ["b@example.com"], mailer="bulk")
        [other] = enqueue_email("d", "b", None, ["d@example.com"])
        burst()
    finally:
        cutting.stop()
    row.refresh_from_db()
    # The hand-over watcher was installed on the mailer's connection: the cut
    # after the final dot is in doubt (abandoned under review), not a retry.
    assert cutting.count() == 1
    assert row.status == Status.ABANDONED
    [attempt] = row.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.AMBIGUOUS
    other.refresh_from_db()
    assert other.status == Status.SENT and default_server.count() == 1


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, 2.0), ({"timeout": 0.5}, 0.5), ({"timeout": 30}, 2.0)],
)
def test_send_timeout_bounds_each_mailer(settings, options, expected):
    settings.OUTBOX = {**settings.OUTBOX, "SEND_TIMEOUT": 2.0}
    add_mailer(settings, "bulk", SMTP, {"host": "127.0.0.1", "port": 2525, **options})
    backend = get_connection("bulk")
    assert type(backend).__module__ == "django.core.mail.backends.smtp"
    assert backend.timeout == expected


# -- rate limits keyed by mailer --------------------------------------------------------


def test_a_mailer_limit_holds_bulk_mail_while_default_mail_flows(
    settings, default_server, bulk_server, queue, running
):
    two_servers(settings, default_server, bulk_server)
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"mailer:bulk": "2/s"}}
    bulk = enqueue_email("b", "b", None, [f"b{i}@example.com" for i in range(12)], mailer="bulk")
    plain = enqueue_email("d", "b", None, [f"d{i}@example.com" for i in range(30)])
    running(concurrency=2)

    def sent(rows: list[Delivery]) -> int:
        return Delivery.objects.filter(pk__in=[d.pk for d in rows], status=Status.SENT).count()

    wait_until(lambda: sent(plain) == 30, timeout=15)
    # The 12 need at least 5.5 s at 2/s; the default mail (same domain) did not wait.
    waiting = Delivery.objects.filter(pk__in=[d.pk for d in bulk], status=Status.QUEUED)
    assert waiting.exists()
    assert set(waiting.values_list("attempts", flat=True)) == {0}  # held, not attempted
    [use] = ratelimit.usage(queue)
    assert (use.key, use.limit) == ("mailer:bulk", "2/s") and use.held >= 1

    wait_until(lambda: sent(bulk) == 12, timeout=30)
    times = sorted(
        d.processing_started_at.timestamp() for d in Delivery.objects.filter(email=bulk[0].email)
    )
    assert times[-1] - times[0] >= 11 * 0.5 * 0.9, times
    assert max(sum(1 for t in times if s <= t < s + 1.0) for s in times) <= 3, times
    assert bulk_server.count() == 12 and default_server.count() == 30
    assert not Attempt.objects.exists()


def test_a_mailer_limit_applies_only_to_that_mailer():
    configured = ratelimit.parse_limits({"mailer:bulk": "1/s", "*": "9/s", "x.org": "2/s"})
    assert set(configured) == {"mailer:bulk", "*", "x.org"}
    assert [x.key for x in ratelimit.applicable("x.org", configured, "bulk")] == [
        "x.org",
        "mailer:bulk",
        "*",
    ]
    assert [x.key for x in ratelimit.applicable("x.org", configured, "")] == ["x.org", "*"]
    assert [x.key for x in ratelimit.applicable("y.org", configured, "other")] == ["*"]


# -- bad input: an unknown mailer at enqueue -------------------------------------------


def mailer_error(exc: pytest.ExceptionInfo[ValidationError], field: str = "mailer") -> str:
    [message] = exc.value.message_dict[field]
    return message


def test_an_unknown_mailer_is_a_validation_error_and_writes_nothing(settings):
    add_mailer(settings, "bulk", LOCMEM)
    EmailTemplate.objects.create(name="news", subject="News", text="Hello")
    before = counts()
    with pytest.raises(ValidationError) as exc:
        enqueue_email("s", "b", None, ["a@example.com"], mailer="bluk")
    assert "'bluk'" in mailer_error(exc) and "bulk" in mailer_error(exc)
    assert exc.value.error_dict["mailer"][0].code == "unknown"
    with pytest.raises(ValidationError) as exc:
        enqueue_template("news", {}, None, ["a@example.com"], mailer="bluk")
    assert "'bluk'" in mailer_error(exc)
    items = [
        {"subject": "s", "message": "b", "recipient_list": ["a@example.com"]},
        {"subject": "s", "message": "b", "recipient_list": ["b@example.com"], "mailer": "bluk"},
    ]
    with pytest.raises(ValidationError) as exc:
        enqueue_many(items)
    assert "'bluk'" in mailer_error(exc, "items[1].mailer")
    with pytest.raises(TypeError):
        enqueue_email("s", "b", None, ["a@example.com"], mailer=5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        enqueue_email("s", "b", None, ["a@example.com"], mailer="x" * 101)
    assert counts() == before


def test_a_mailer_that_is_the_outbox_itself_is_refused(settings):
    """On 6.1 the "default" mailer usually is the outbox: its mail would loop forever."""
    add_mailer(settings, "loop", "outbox.backends.OutboxBackend")
    before = counts()
    with pytest.raises(ValidationError) as exc:
        enqueue_email("s", "b", None, ["a@example.com"], mailer="loop")
    assert "'loop'" in mailer_error(exc)
    assert counts() == before
    assert not is_delivery_mailer("loop")
    assert "loop" not in delivery_mailers()


def test_no_mailer_and_a_blank_one_are_the_default(settings):
    [a] = enqueue_email("s", "b", None, ["a@example.com"])
    [b] = enqueue_email("s", "b", None, ["b@example.com"], mailer="")
    assert Email.objects.get(pk=a.email_id).mailer == Email.objects.get(pk=b.email_id).mailer == ""


# -- the drop-in backend ----------------------------------------------------------------


def test_the_outbox_backend_can_queue_for_a_mailer(settings):
    add_mailer(settings, "bulk", LOCMEM)
    backend = OutboxBackend(mailer="bulk")
    assert backend.send_messages([sample_message(to=["a@example.com"])]) == 1
    [row] = Delivery.objects.all()
    assert row.email.mailer == "bulk"
    with pytest.raises(ImproperlyConfigured, match="'bluk'"):
        OutboxBackend(mailer="bluk")


# -- system checks: outbox.E010, E012-E014 ------------------------------------------------


def ids(code: str) -> list[str]:
    return [e.msg for e in outbox_checks() if e.id == code]


def without_mailers(settings) -> None:
    """Django 6.1 not migrated to MAILERS (or 5.2): OUTBOX["BACKENDS"] is read."""
    if HAS_MAILERS:
        del settings.MAILERS


@pytest.mark.parametrize(
    "backends",
    [
        ["bulk"],
        {"bulk": 5},
        {"bulk": {"OPTIONS": {}}},
        {"bulk": {"BACKEND": LOCMEM, "OPTIONS": []}},
        {"bulk": {"BACKEND": LOCMEM, "EXTRA": 1}},
        {"": LOCMEM},
        {"bulk": "no.such.module.Backend"},
        {"bulk": "outbox.backends.OutboxBackend"},
        {"x" * 101: LOCMEM},
    ],
)
def test_e012_a_malformed_backends_entry(settings, backends):
    without_mailers(settings)
    settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": backends}
    assert len(ids("outbox.E012")) == 1


def test_good_backends_pass_the_checks(settings):
    without_mailers(settings)
    settings.OUTBOX = {
        **settings.OUTBOX,
        "BACKENDS": {"bulk": {"BACKEND": SMTP, "OPTIONS": {"port": 2525}}, "files": LOCMEM},
        "RATE_LIMITS": {"mailer:bulk": "10/s"},
    }
    assert [e.id for e in outbox_checks() if e.id in ("outbox.E012", "outbox.E013")] == []
    assert delivery_mailers() == ["bulk", "files"]


@pytest.mark.skipif(not HAS_MAILERS, reason="MAILERS exists on Django 6.1 only")
def test_e014_backends_beside_mailers(settings):
    settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": {"bulk": LOCMEM}}
    [message] = ids("outbox.E014")
    assert "'bulk'" in message
    assert not is_delivery_mailer("bulk")  # one namespace at a time: MAILERS


def test_e013_a_limit_for_a_mailer_no_email_can_name(settings):
    add_mailer(settings, "bulk", LOCMEM)
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"mailer:bluk": "1/s"}}
    [message] = ids("outbox.E013")
    assert "'bluk'" in message
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"mailer:bulk": "1/s"}}
    assert ids("outbox.E013") == []


@pytest.mark.parametrize("key", ["mailer:", "mailer:  "])
def test_e010_a_mailer_key_without_an_alias(settings, key):
    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {key: "1/s"}}
    [message] = ids("outbox.E010")
    assert "names no mailer" in message
