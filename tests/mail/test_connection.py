"""The worker's SMTP connection (outbox/mail/connection.py): pipelining, RFC 2920.

Django's SMTP backend, as the worker creates it, against :class:`ScriptedSMTP`:
a server on loopback whose replies each test chooses and that tells whether a
transaction's MAIL, RCPT and DATA came in one write. Each refusal is sent
pipelined and not, and must end the same way: what smtplib raises, and a
connection that goes on to send the next message. The hand-over's watch and
fence over a pipelined connection are in tests/faults (test_ambiguous.py,
test_promise_machinery.py), against aiosmtpd offering PIPELINING.
"""

from __future__ import annotations

import smtplib
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.mail import EmailMessage

from outbox.mail.handover import watch_handover
from outbox.mail.targets import get_delivery_connection
from tests.delivery import use_smtp
from tests.servers import ScriptedSMTP


def opened(settings, server: ScriptedSMTP, pipelining: bool = True) -> Any:
    """The worker's delivery backend to ``server``, opened and watched, as the worker has it."""
    use_smtp(settings, server.port, SEND_TIMEOUT=5.0, SMTP_PIPELINING=pipelining)
    backend = get_delivery_connection()
    assert backend.open()
    watch_handover(backend)
    return backend


@pytest.fixture
def scripted() -> Iterator[list[ScriptedSMTP]]:
    started: list[ScriptedSMTP] = []
    yield started
    for server in started:
        server.stop()


def serve(scripted: list[ScriptedSMTP], **script: Any) -> ScriptedSMTP:
    server = ScriptedSMTP(**script).start()
    scripted.append(server)
    return server


def mail(to: str = "a@example.com", body: str = "Hello\n") -> EmailMessage:
    return EmailMessage("Subject", body, "shop@example.com", [to])


def test_a_server_that_offers_pipelining_gets_each_transaction_in_one_write(settings, scripted):
    server = serve(scripted)
    backend = opened(settings, server)
    # A line that starts with a dot goes doubled and comes back single (RFC 5321 4.5.2).
    body = "first line\n.a line with a leading dot\n.\nlast line\n"

    assert backend.send_messages([mail(body=body), mail(to="b@example.com")]) == 2
    backend.close()

    assert [(t.pipelined, t.mail_from, t.recipients) for t in server.transactions] == [
        (True, "shop@example.com", ["a@example.com"]),
        (True, "shop@example.com", ["b@example.com"]),
    ]
    received = server.transactions[0].body
    assert received is not None
    assert received.endswith(body.replace("\n", "\r\n").encode())
    # SIZE was offered: the MAIL line carries the message's size, as smtplib's does.
    assert server.commands[1].startswith("MAIL FROM:<shop@example.com> size=")


@pytest.mark.parametrize("offered", [True, False], ids=["setting-off", "not-offered"])
def test_one_command_at_a_time_when_turned_off_or_not_offered(settings, scripted, offered):
    server = serve(scripted, pipelining=offered, hold=0.2)
    backend = opened(settings, server, pipelining=not offered)

    assert backend.send_messages([mail()]) == 1
    backend.close()

    [transaction] = server.transactions
    assert transaction.pipelined is False
    assert transaction.recipients == ["a@example.com"]
    assert transaction.body is not None


REFUSALS = {
    "sender": ({"mail_reply": "550 5.7.1 sender rejected"}, smtplib.SMTPSenderRefused, 550),
    "recipient": (
        {"refuse": {"a@example.com": "550 5.1.1 no such user"}},
        smtplib.SMTPRecipientsRefused,
        550,
    ),
    "data": ({"data_reply": "451 4.3.0 try again later"}, smtplib.SMTPDataError, 451),
    "final dot": ({"final_reply": "554 5.7.1 spam"}, smtplib.SMTPDataError, 554),
    # A server that says 354 to the DATA of a transaction without a sender or a
    # recipient gets the final dot alone: an empty message, to nobody.
    "sender, then 354": (
        {"mail_reply": "550 5.7.1 sender rejected", "data_reply": "354 go on"},
        smtplib.SMTPSenderRefused,
        550,
    ),
    "recipient, then 354": (
        {"refuse": {"a@example.com": "550 5.1.1 no such user"}, "data_reply": "354 go on"},
        smtplib.SMTPRecipientsRefused,
        550,
    ),
}


def verbs(server: ScriptedSMTP) -> list[str]:
    return [command.split(" ", 1)[0].split(":", 1)[0].upper() for command in server.commands]


def smtp_code(error: BaseException) -> int:
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        [(code, _reply)] = error.recipients.values()
        return int(code)
    assert isinstance(error, smtplib.SMTPResponseException)
    return int(error.smtp_code)


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "one-at-a-time"])
@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_a_refusal_means_what_it_means_to_smtplib_and_the_next_message_goes(
    settings, scripted, refusal, pipelining
):
    script, error_class, code = REFUSALS[refusal]
    server = serve(scripted, hold=0.05, **script)
    backend = opened(settings, server, pipelining)

    with pytest.raises(error_class) as info:
        backend.send_messages([mail()])
    assert smtp_code(info.value) == code
    # The transaction was reset, every reply read: the next message on the same
    # connection goes through.
    server.mail_reply, server.refuse, server.data_reply = "250 OK", {}, None
    server.final_reply = "250 2.0.0 queued"
    assert backend.send_messages([mail(to="b@example.com")]) == 1
    backend.close()

    assert server.transactions[-1].recipients == ["b@example.com"]
    assert server.transactions[-1].body is not None
    assert server.transactions[-1].pipelined is pipelining
    # smtplib does not reset after DATA's own refusal (a server would then
    # refuse the next MAIL as nested); pipelined, every refusal is reset.
    assert ("RSET" in verbs(server)) is (pipelining or refusal != "data")


@pytest.mark.parametrize(
    ("script", "error_class"),
    [
        ({"mail_reply": "421 4.3.2 shutting down"}, smtplib.SMTPSenderRefused),
        ({"refuse": {"a@example.com": "421 4.3.2 shutting down"}}, smtplib.SMTPRecipientsRefused),
        ({"data_reply": "421 4.3.2 shutting down"}, smtplib.SMTPDataError),
    ],
    ids=["mail", "rcpt", "data"],
)
def test_a_421_closes_the_connection(settings, scripted, script, error_class):
    """The server is going away: close, as smtplib does after a 421 to MAIL, RCPT or the dot."""
    server = serve(scripted, **script)
    backend = opened(settings, server)

    with pytest.raises(error_class) as info:
        backend.send_messages([mail()])

    assert smtp_code(info.value) == 421
    assert backend.connection.sock is None  # closed: the next send opens a new one
    assert "RSET" not in verbs(server)


def test_a_line_break_in_a_command_is_refused_before_anything_is_written(settings, scripted):
    """smtplib refuses a command with CR or LF in it: it would start another command."""
    server = serve(scripted)
    backend = opened(settings, server)

    with pytest.raises(ValueError, match="newline"):
        backend.connection.sendmail(
            "shop@example.com", ["a@example.com"], b"x\r\n", rcpt_options=["NOTIFY=NEVER\r\nRSET"]
        )
    assert backend.send_messages([mail()]) == 1
    backend.close()

    assert verbs(server) == ["EHLO", "MAIL", "RCPT", "DATA", "QUIT"]
