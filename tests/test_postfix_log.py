"""PostfixLogReconciler on log lines in Postfix's real format.

The fixtures are what Postfix 3 writes for a message handed over by
``sendmail`` (pickup, cleanup, qmgr, then a delivery agent), with both
syslog timestamp styles: traditional (``Nov 23 12:00:01``, local time, no
year) and RFC 3339 (``2026-11-23T12:00:01.123456+00:00``).
"""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from outbox.reconcilers import PostfixLogReconciler, Question, Verdict
from outbox.reconcilers.postfix_log import log_files, parse_timestamp, scan

T0 = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def traditional(at: datetime) -> str:
    return at.astimezone().strftime("%b %e %H:%M:%S")


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


def q(pk: int, mid: str, rcpt: str = "a@example.org", start: datetime = T0, gone_after: float = 40):
    return Question(pk, mid, rcpt, start, start + timedelta(seconds=gone_after))


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


def test_absent_while_the_log_covers_the_attempt_is_sure_not_sent(tmp_path):
    log = write(
        tmp_path / "mail.log", noise(T0 - timedelta(hours=1)) + noise(T0 + timedelta(minutes=5))
    )
    answer = ask(log, q(1, "<never@example.com>"))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, True)


def test_absent_but_the_log_ends_inside_the_send_window_is_not_sure(tmp_path):
    # Postfix lines stop 10 s after the start: a sendmail child could still
    # have handed the message over within SEND_TIMEOUT (30 s).
    log = write(
        tmp_path / "mail.log", noise(T0 - timedelta(hours=1)) + noise(T0 + timedelta(seconds=10))
    )
    answer = ask(log, q(1, "<never@example.com>", gone_after=5))[1]
    assert (answer.verdict, answer.sure) == (Verdict.NOT_SENT, False)


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
    # The oldest file reaches back before the oldest attempt: the absence is sure.
    assert (answers[3].verdict, answers[3].sure) == (Verdict.NOT_SENT, True)


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
