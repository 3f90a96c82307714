"""PostfixLogReconciler on log lines in Postfix's real format.

The fixtures are what Postfix 3 writes for a message handed over by
``sendmail`` (pickup, cleanup, qmgr, then a delivery agent), with both
syslog timestamp styles: traditional (``Nov 23 12:00:01``, the host's zone,
no year) and RFC 3339 (``2026-11-23T12:00:01.123456+00:00``). "Not sent"
needs sibling rows in the database: other messages of the same worker
incarnation through the same mailer, found in the log.
"""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured

from outbox import enqueue_email
from outbox.models import Delivery, Email
from outbox.reconcilers import PostfixLogReconciler, Question, Verdict
from outbox.reconcilers.evidence import log_host_matches
from outbox.reconcilers.postfix_log import host_zone, log_files, parse_timestamp, scan
from tests.postfix import other_zone

T0 = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
WORKER = "mx1:4242#a1b2c3"


def traditional(at: datetime) -> str:
    return at.astimezone(host_zone()).strftime("%b %e %H:%M:%S")


def rfc3339(at: datetime) -> str:
    return at.isoformat(timespec="microseconds")


def message(qid: str, mid: str, rcpt: str, at: datetime, stamp=rfc3339, **status) -> list[str]:
    """One message's lines, from pickup to its delivery agent (if ``status``)."""
    lines = [
        f"{stamp(at)} mx postfix/pickup[811]: {qid}: uid=33 from=<shop@example.com>",
        f"{stamp(at)} mx postfix/cleanup[812]: {qid}: message-id={mid}",
        f"{stamp(at)} mx postfix/qmgr[600]: {qid}: from=<shop@example.com>, size=1634, "
        "nrcpt=1 (queue active)",
    ]
    if status:
        agent = status.get("agent", "smtp")
        when = stamp(at + timedelta(seconds=1))
        lines.append(
            f"{when} mx postfix/{agent}[813]: {qid}: to=<{rcpt}>, "
            "relay=mx.example.org[203.0.113.5]:25, delay=0.41, delays=0.05/0.01/0.2/0.15, "
            f"dsn={status['dsn']}, status={status['status']} ({status['text']})"
        )
        lines.append(f"{when} mx postfix/qmgr[600]: {qid}: removed")
    return lines


def noise(at: datetime, stamp=rfc3339) -> list[str]:
    """Other daemons and other messages, as a real mail.log interleaves them."""
    return [
        f"{stamp(at)} mx postfix/smtpd[900]: connect from unknown[198.51.100.7]",
        f"{stamp(at)} mx dovecot: imap-login: Login: user=<bob>, method=PLAIN",
        f"{stamp(at)} mx postfix/anvil[901]: statistics: max connection rate 1/60s",
        *message(
            "9ZZ1Q2R3S4",
            "<other@example.com>",
            "x@example.net",
            at,
            stamp,
            status="sent",
            dsn="2.0.0",
            text="250 2.0.0 Ok: queued as 1A2B",
        ),
    ]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def ask(path: Path, *questions: Question):
    return PostfixLogReconciler(str(path)).answer_many(list(questions))


def q(
    pk: int,
    mid: str,
    rcpt: str = "a@example.org",
    start: datetime = T0,
    gone_after: float = 40,
    worker: str = "",
    mailer: str = "",
    server: str = "mx",
    address: str = "",
):
    """The question about an attempt handed to ``server`` (the log lines' host is "mx")."""
    gone = start + timedelta(seconds=gone_after)
    return Question(pk, mid, rcpt, start, gone, worker, mailer, server, address)


def sibling(
    at: datetime, worker: str = WORKER, mailer: str = "", server: str = "mx", address: str = ""
) -> str:
    """A row ``worker`` marked sent through ``mailer`` to ``server`` at ``at``; its Message-ID."""
    [row] = enqueue_email("s", "b", None, ["sib@example.org"])
    Delivery.objects.filter(pk=row.pk).update(
        status=Delivery.Status.SENT,
        worker_id=worker,
        sent_at=at,
        processing_started_at=at,
        server_host=server,
        server_address=address,
    )
    Email.objects.filter(pk=row.email_id).update(mailer=mailer)
    return row.message_id


def handed_over(mid: str, at: datetime, stamp=rfc3339) -> list[str]:
    """Postfix's lines for a sibling it accepted and relayed."""
    return message(
        "2C2C2C2C2C", mid, "sib@example.org", at, stamp, status="sent", dsn="2.0.0", text="250 ok"
    )


@pytest.fixture(autouse=True)
def _short_send_timeout(settings):
    settings.OUTBOX = {**settings.OUTBOX, "SEND_TIMEOUT": 30.0}


@pytest.mark.parametrize("stamp", [traditional, rfc3339], ids=["traditional", "rfc3339"])
@pytest.mark.parametrize(
    ("status", "dsn", "text", "agent"),
    [
        ("sent", "2.0.0", "250 2.0.0 OK 1700000000 q1si123 - gsmtp", "smtp"),
        ("bounced", "5.1.1", "host mx.example.org said: 550 5.1.1 User unknown", "smtp"),
        (
            "deferred",
            "4.4.1",
            "connect to mx.example.org[203.0.113.5]:25: Connection refused",
            "smtp",
        ),
        ("sent", "2.0.0", "delivered to mailbox", "local"),
        ("sent", "2.0.0", "250 2.0.0 <a@example.org> Saved", "lmtp"),
        ("sent", "2.0.0", "delivered to maildir", "virtual"),
    ],
)
def test_any_delivery_line_for_the_recipient_means_sent(tmp_path, stamp, status, dsn, text, agent):
    mid = "<5f0c1e2d3b4a@example.com>"
    at = T0 + timedelta(seconds=2)
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=1), stamp)
        + message(
            "4Bx0Yz1abcz",
            mid,
            "a@example.org",
            at,
            stamp,
            status=status,
            dsn=dsn,
            text=text,
            agent=agent,
        )
        + noise(T0 + timedelta(minutes=5), stamp),
    )
    answer = ask(log, q(1, mid))[1]
    assert answer.verdict is Verdict.SENT
    assert f"status={status}" in answer.evidence and "4Bx0Yz1abcz" in answer.evidence


def test_queued_but_not_yet_delivered_is_sent(tmp_path):
    mid = "<queued@example.com>"
    log = write(
        tmp_path / "mail.log",
        message("3F1A2B4C5D", mid, "a@example.org", T0) + noise(T0 + timedelta(minutes=5)),
    )
    answer = ask(log, q(1, mid))[1]
    assert answer.verdict is Verdict.SENT and "3F1A2B4C5D" in answer.evidence


def test_cleanup_without_qmgr_is_unknown(tmp_path):
    mid = "<cut@example.com>"
    log = write(
        tmp_path / "mail.log",
        [
            *noise(T0 - timedelta(hours=1)),
            f"{rfc3339(T0)} mx postfix/cleanup[812]: 7C7C7C7C7C: message-id={mid}",
            *noise(T0 + timedelta(minutes=5)),
        ],
    )
    assert ask(log, q(1, mid))[1].verdict is Verdict.UNKNOWN


@pytest.mark.django_db
@pytest.mark.parametrize("stamp", [traditional, rfc3339], ids=["traditional", "rfc3339"])
def test_absent_while_the_log_covers_the_attempt_is_sure_not_sent(tmp_path, stamp):
    mid = sibling(T0 - timedelta(minutes=2))
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=1), stamp)
        + handed_over(mid, T0 - timedelta(minutes=2), stamp)
        + noise(T0 + timedelta(minutes=5), stamp),
    )
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, True)
    assert WORKER in answer.evidence and mid in answer.evidence


@pytest.mark.django_db
def test_absent_but_the_log_ends_inside_the_send_window_is_not_sure(tmp_path):
    # Postfix lines stop 10 s after the start: a sendmail child could still
    # have handed the message over within SEND_TIMEOUT (30 s).
    mid = sibling(T0 - timedelta(minutes=2))
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=1))
        + handed_over(mid, T0 - timedelta(minutes=2))
        + noise(T0 + timedelta(seconds=10)),
    )
    answer = ask(log, q(1, "<never@example.com>", gone_after=5, worker=WORKER))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, False)


@pytest.mark.django_db
def test_another_servers_log_is_unknown_however_well_it_covers(tmp_path):
    """The worker's other messages went elsewhere: this log cannot rule the handover out."""
    sibling(T0 - timedelta(minutes=2))
    log = write(
        tmp_path / "mail.log", noise(T0 - timedelta(hours=1)) + noise(T0 + timedelta(minutes=5))
    )
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER))[1]
    assert answer.verdict is Verdict.UNKNOWN
    assert "none of the 1 other messages" in answer.evidence and WORKER in answer.evidence


@pytest.mark.django_db
def test_a_worker_that_sent_nothing_else_proves_nothing(tmp_path):
    mid = sibling(T0 - timedelta(minutes=2), worker="mx2:1#ffffff")  # another incarnation's
    old = sibling(T0 - timedelta(hours=3))  # this incarnation's, but long before
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=4))
        + handed_over(old, T0 - timedelta(hours=3))
        + handed_over(mid, T0 - timedelta(minutes=2))
        + noise(T0 + timedelta(minutes=5)),
    )
    answers = ask(log, q(1, "<never@example.com>", worker=WORKER), q(2, "<nor@example.com>"))
    assert answers[1].verdict is Verdict.UNKNOWN and "marked nothing else" in answers[1].evidence
    assert answers[2].verdict is Verdict.UNKNOWN and "names no worker" in answers[2].evidence


@pytest.mark.django_db
def test_siblings_through_another_mailer_do_not_count(tmp_path):
    """The default mailer may be the local Postfix while "bulk" is a remote relay."""
    mid = sibling(T0 - timedelta(minutes=2), mailer="")
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=1))
        + handed_over(mid, T0 - timedelta(minutes=2))
        + noise(T0 + timedelta(minutes=5)),
    )
    answers = ask(
        log,
        q(1, "<bulk@example.com>", worker=WORKER, mailer="bulk"),
        q(2, "<default@example.com>", worker=WORKER),
    )
    assert answers[1].verdict is Verdict.UNKNOWN and "'bulk'" in answers[1].evidence
    assert (answers[2].verdict, answers[2].sure) == (Verdict.NOT_SENT, True)


@pytest.mark.django_db
def test_a_sibling_postfix_only_saw_in_cleanup_is_no_evidence(tmp_path):
    mid = sibling(T0 - timedelta(minutes=2))
    log = write(
        tmp_path / "mail.log",
        [
            *noise(T0 - timedelta(hours=1)),
            f"{rfc3339(T0 - timedelta(minutes=2))} mx postfix/cleanup[812]: 1D1D1D1D1D: "
            f"message-id={mid}",
            *noise(T0 + timedelta(minutes=5)),
        ],
    )
    assert ask(log, q(1, "<never@example.com>", worker=WORKER))[1].verdict is Verdict.UNKNOWN


# -- one host name, a pool of relays: only the log of the server the row names ------


def relay_log(tmp_path: Path, host: str, *lines: list[str]) -> Path:
    """A log covering T0 - 1 h .. T0 + 5 min, written by ``host`` (its syslog host field)."""
    every = [*noise(T0 - timedelta(hours=1))]
    for more in lines:
        every += more
    every += noise(T0 + timedelta(minutes=5))
    path = tmp_path / f"{host}.log"
    return write(path, [line.replace(" mx ", f" {host} ", 1) for line in every])


@pytest.mark.django_db
def test_another_relays_log_is_unknown_though_it_holds_the_workers_other_mail(tmp_path):
    """Issue 33: S went to relay A, X to relay B; A's log lacks X but proves nothing about B."""
    mid = sibling(T0 - timedelta(minutes=2), server="relay-a.example")
    log = relay_log(tmp_path, "relay-a.example", handed_over(mid, T0 - timedelta(minutes=2)))
    answers = ask(
        log,
        q(1, "<x@example.com>", worker=WORKER, server="relay-b.example"),
        q(2, "<y@example.com>", worker=WORKER, server="relay-a.example"),
    )
    assert answers[1].verdict is Verdict.UNKNOWN
    assert (
        "relay-b.example" in answers[1].evidence and "not that server's log" in answers[1].evidence
    )
    # The same log still rules a handover to relay A out.
    assert (answers[2].verdict, answers[2].sure) == (Verdict.NOT_SENT, True)
    assert mid in answers[2].evidence and "relay-a.example" in answers[2].evidence


@pytest.mark.django_db
def test_a_log_with_lines_of_several_hosts_is_not_one_servers_log(tmp_path):
    mid = sibling(T0 - timedelta(minutes=2))
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=1))
        + handed_over(mid, T0 - timedelta(minutes=2))
        + [f"{rfc3339(T0)} mx2 postfix/anvil[7]: statistics: max cache size 1"]
        + noise(T0 + timedelta(minutes=5)),
    )
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER))[1]
    assert answer.verdict is Verdict.UNKNOWN and "mx2" in answer.evidence


@pytest.mark.django_db
def test_mail_the_worker_handed_to_another_server_of_that_name_does_not_count(tmp_path):
    """Same greeting host name, another peer address: not shown to be the same server."""
    mid = sibling(T0 - timedelta(minutes=2), address="192.0.2.1:25")
    sibling(T0 - timedelta(minutes=3), address="")
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(hours=1))
        + handed_over(mid, T0 - timedelta(minutes=2))
        + noise(T0 + timedelta(minutes=5)),
    )
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER, address="192.0.2.2:25"))[1]
    # The one at another address is not this server's; the one with no address
    # recorded counts, but is not in this log.
    assert answer.verdict is Verdict.UNKNOWN
    assert "none of the 1 other messages" in answer.evidence
    same = ask(log, q(2, "<never@example.com>", worker=WORKER, address="192.0.2.1:25"))[2]
    assert (same.verdict, same.sure) == (Verdict.NOT_SENT, True)


@pytest.mark.django_db
def test_a_row_that_names_no_server_is_unknown(tmp_path):
    """Written by a worker without reconcilers, or killed before it named the server."""
    mid = sibling(T0 - timedelta(minutes=2))
    log = relay_log(tmp_path, "mx", handed_over(mid, T0 - timedelta(minutes=2)))
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER, server=""))[1]
    assert answer.verdict is Verdict.UNKNOWN and "names no server" in answer.evidence


@pytest.mark.django_db
def test_syslogs_short_host_name_matches_the_greetings_full_one(tmp_path):
    mid = sibling(T0 - timedelta(minutes=2), server="mx.example.com")
    log = relay_log(tmp_path, "mx", handed_over(mid, T0 - timedelta(minutes=2)))
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER, server="MX.example.com."))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, True)


@pytest.mark.django_db
def test_a_message_accepted_in_any_log_is_still_sent(tmp_path):
    """ "Sent" needs no proof of whose log it is: the Message-ID accepted is enough."""
    mid = "<x@example.com>"
    log = relay_log(
        tmp_path,
        "relay-a.example",
        message("5A5A5A5A5A", mid, "a@example.org", T0, status="sent", dsn="2.0.0", text="250"),
    )
    answer = ask(log, q(1, mid, worker=WORKER, server="relay-b.example"))[1]
    assert answer.verdict is Verdict.SENT


@pytest.mark.parametrize(
    ("log_host", "greeting", "match"),
    [
        ("mx", "mx", True),
        ("mx", "mx.example.com", True),
        ("mx.example.com", "MX", True),
        ("mx.example.com", "mx.example.com.", True),
        ("mx2", "mx.example.com", False),
        ("relay-a", "relay-b.example.com", False),
        ("mx", "", False),
    ],
)
def test_which_syslog_host_fields_name_the_server(log_host, greeting, match):
    assert log_host_matches(log_host, greeting) is match


def test_a_log_that_starts_after_the_attempt_is_unknown(tmp_path):
    log = write(tmp_path / "mail.log", noise(T0 + timedelta(hours=1)))
    assert ask(log, q(1, "<never@example.com>"))[1].verdict is Verdict.UNKNOWN


def test_the_recipient_must_match(tmp_path):
    mid = "<two@example.com>"
    log = write(
        tmp_path / "mail.log",
        message("5D5D5D5D5D", mid, "b@example.org", T0, status="sent", dsn="2.0.0", text="250 ok")
        + noise(T0 + timedelta(minutes=5)),
    )
    # Committed, so Postfix owns it; but the status line is another recipient's.
    answer = ask(log, q(1, mid, rcpt="A@Example.org"))[1]
    assert answer.verdict is Verdict.SENT and "no delivery line" in answer.evidence


def test_rotated_and_gzipped_files_are_read_oldest_first(tmp_path):
    mid_old, mid_new = "<old@example.com>", "<new@example.com>"
    day_before = T0 - timedelta(days=1)
    with gzip.open(tmp_path / "mail.log.2.gz", "wt") as handle:
        handle.write("\n".join(noise(day_before - timedelta(days=1))) + "\n")
    # The cleanup line is in mail.log.1, the delivery line in mail.log.
    first = message("6E6E6E6E6E", mid_old, "a@example.org", day_before)
    write(tmp_path / "mail.log.1", noise(day_before - timedelta(hours=1)) + first)
    write(
        tmp_path / "mail.log",
        [
            f"{rfc3339(T0)} mx postfix/smtp[813]: 6E6E6E6E6E: to=<a@example.org>, relay=none, "
            "delay=86400, dsn=4.4.1, status=deferred (connect to mx.example.org: timed out)",
            *message("8F8F8F8F8F", mid_new, "c@example.org", T0 + timedelta(seconds=1)),
            *noise(T0 + timedelta(minutes=5)),
        ],
    )
    assert [p.name for p in log_files(tmp_path / "mail.log")] == [
        "mail.log",
        "mail.log.1",
        "mail.log.2.gz",
    ]
    answers = ask(
        tmp_path / "mail.log",
        q(1, mid_old, start=day_before),
        q(2, mid_new, rcpt="c@example.org"),
        q(3, "<absent@example.com>", start=day_before - timedelta(hours=2)),
    )
    assert answers[1].verdict is Verdict.SENT and "status=deferred" in answers[1].evidence
    assert answers[2].verdict is Verdict.SENT
    # The oldest file reaches back before the oldest attempt, but nothing shows
    # whose log it is: no worker, no siblings.
    assert answers[3].verdict is Verdict.UNKNOWN


@pytest.mark.django_db
def test_a_sibling_in_a_rotated_file_is_read(tmp_path):
    """The scan reaches back to the siblings, not only to the attempt."""
    mid = sibling(T0 - timedelta(minutes=30))
    write(
        tmp_path / "mail.log.1",
        noise(T0 - timedelta(hours=1)) + handed_over(mid, T0 - timedelta(minutes=30)),
    )
    write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(minutes=10)) + noise(T0 + timedelta(minutes=5)),
    )
    answer = ask(tmp_path / "mail.log", q(1, "<never@example.com>", worker=WORKER))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, True)


def test_only_the_files_the_oldest_question_needs_are_read(tmp_path):
    write(tmp_path / "mail.log.1", noise(T0 - timedelta(days=1)))
    write(tmp_path / "mail.log", noise(T0 - timedelta(hours=1)) + noise(T0 + timedelta(minutes=5)))
    found = scan(tmp_path / "mail.log", {"<x@example.com>"}, T0, T0 + timedelta(hours=1))
    assert found.files == [str(tmp_path / "mail.log")]
    found = scan(tmp_path / "mail.log", {"<x@example.com>"}, T0 - timedelta(hours=2), T0)
    assert found.files == [str(tmp_path / "mail.log.1"), str(tmp_path / "mail.log")]


def test_a_missing_log_is_unknown(tmp_path):
    assert ask(tmp_path / "nope.log", q(1, "<a@example.com>"))[1].verdict is Verdict.UNKNOWN


def test_traditional_timestamps_take_the_latest_year_not_in_the_future():
    now = datetime(2027, 1, 2, 10, 0, tzinfo=UTC)
    december = parse_timestamp("Dec 31 23:59:59", now)
    assert december is not None and december.year == 2026
    january = parse_timestamp("Jan  2 09:00:00", now)
    assert january is not None and january.year == 2027
    assert parse_timestamp("2026-11-23T12:00:01.5+01:00", now) == datetime(
        2026, 11, 23, 11, 0, 1, 500000, tzinfo=UTC
    )


def test_zone_less_times_are_the_hosts_not_djangos(settings):
    """Django sets the process's zone from TIME_ZONE; syslog wrote the host's."""
    settings.TIME_ZONE = other_zone()
    now = datetime(2026, 11, 24, tzinfo=UTC)
    expected = datetime(2026, 11, 23, 12, 0, 1, tzinfo=host_zone())
    assert parse_timestamp("Nov 23 12:00:01", now) == expected
    assert parse_timestamp("2026-11-23T12:00:01", now) == expected


def test_host_zone_falls_back_to_utc(tmp_path):
    assert host_zone(tmp_path / "no-localtime") is UTC
    (tmp_path / "garbage").write_bytes(b"not a zone file")
    assert host_zone(tmp_path / "garbage") is UTC


@pytest.mark.django_db
def test_the_log_time_zone_setting(settings, tmp_path):
    """A log written in New York time, read on a host in another zone."""
    settings.OUTBOX = {**settings.OUTBOX, "POSTFIX_LOG_TIME_ZONE": "America/New_York"}
    new_york = ZoneInfo("America/New_York")

    def stamp(at: datetime) -> str:
        return at.astimezone(new_york).strftime("%b %e %H:%M:%S")

    mid = sibling(T0 - timedelta(minutes=2))
    # Read in UTC these lines would lie five hours before the attempt: "unknown".
    log = write(
        tmp_path / "mail.log",
        noise(T0 - timedelta(minutes=30), stamp)
        + handed_over(mid, T0 - timedelta(minutes=2), stamp)
        + noise(T0 + timedelta(minutes=5), stamp),
    )
    answer = ask(log, q(1, "<never@example.com>", worker=WORKER))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, True)
    settings.OUTBOX = {**settings.OUTBOX, "POSTFIX_LOG_TIME_ZONE": "Mars/Olympus_Mons"}
    with pytest.raises(ImproperlyConfigured, match="Mars/Olympus_Mons"):
        ask(log, q(1, "<never@example.com>", worker=WORKER))
