"""The failure alarm with a real worker process and a mail server that refuses every sender.

30 emails meet a 451 at MAIL FROM, attempt after attempt: within a second or
two ``outbox_status``, its JSON, the metrics and the dashboard show the alarm
with the cause (the server's reply, its address removed); the worker's log
has one line when it begins and one a window while it goes on, not a line per
failed attempt; once the server takes mail again, every email is sent and the
alarm clears, in the log and everywhere else. The window is 3 s here (the
default is 60), so that the test takes about 15 s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from tests.cells import slow_processes
from tests.processes import Run
from tests.servers import RefusingSenders, wait_until

pytestmark = slow_processes(
    ("5.2:sqlite",),
    why="a worker process against a refusing SMTP server; the alarm lives in Redis and the "
    "worker's log, the same on every database and Django version",
)

WINDOW, LEAST, SHARE = 3.0, 5, 0.5
REPLY = "451 4.7.1 <outbox-tests@example.com>: Sender address rejected: try again later"
CAUSE = "SMTPSenderRefused 451 4.7.1 <address>: Sender address rejected: try again later"
TOKEN = "tests-only-metrics-token"  # tests/settings.py
EMAILS = 30


@pytest.fixture
def refusing() -> Iterator[RefusingSenders]:
    server = RefusingSenders(mail_reply=REPLY).start()
    yield server
    server.stop()


def status(*args: str) -> str:
    out = StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


def alarm_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "failure alarm for" in line]


def test_one_line_a_window_and_everywhere_within_seconds_then_it_clears(
    refusing, worker_process, settings, client, admin_client
):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "FAILURE_ALARM_WINDOW": WINDOW,
        "FAILURE_ALARM_MIN": LEAST,
        "FAILURE_ALARM_SHARE": SHARE,
    }
    enqueue_email(
        "Your order",
        "Thanks!",
        None,
        [f"customer{i}@example.com" for i in range(EMAILS)],
        max_attempts=1000,  # the refusal lasts until the server is fixed
    )
    run = Run(
        worker_process(
            "--concurrency",
            "2",
            OUTBOX_TEST_SMTP_PORT=str(refusing.port),
            OUTBOX_TEST_FAILURE_ALARM=f"{WINDOW},{LEAST},{SHARE}",
        )
    )

    # outbox_status says so first, with the cause, no address.
    text = wait_until(lambda: "FAILURE ALARM" in (out := status()) and out, timeout=30)
    [line] = [x for x in text.splitlines() if x.startswith("FAILURE ALARM")]
    assert line.startswith("FAILURE ALARM: the default mailer: ")
    assert line.endswith(f"most often: {CAUSE}") and "@" not in line
    failures = json.loads(status("--json"))["redis"]["failures"]
    assert failures["mailers"][""]["alarm"] is True
    assert failures["mailers"][""]["cause"] == CAUSE
    assert failures["mailers"][""]["failed"] >= LEAST
    # The metrics and the dashboard, read while it lasts.
    scrape = client.get("/outbox/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    lines = scrape.content.decode().splitlines()
    assert 'outbox_failure_alarm{mailer=""} 1' in lines
    assert f'# outbox_failure_alarm{{mailer=""}} cause: {CAUSE}' in lines
    page = admin_client.get(reverse("admin:outbox_dashboard")).content.decode()
    assert "Failure alarm: the default mailer." in page
    assert "SMTPSenderRefused 451 4.7.1 &lt;address&gt;: Sender address rejected" in page

    # The log: a line when it began, one a window later; not one per failed attempt.
    wait_until(lambda: any("goes on" in x for x in alarm_lines(run.output())), timeout=3 * WINDOW)
    output = run.output()
    failed = Attempt.objects.filter(outcome=Attempt.Outcome.RETRY).count()
    said = alarm_lines(output)
    assert said[0].endswith(
        "Its single failed attempts are logged at DEBUG while the alarm lasts; this line "
        "comes again every 3s"
    )
    assert CAUSE in said[0] and "@" not in said[0]
    assert len(said) == 2 and "goes on" in said[1], said
    single = re.findall(r"delivery \d+: attempt \d+ of 1000 failed", output)
    # The failures before the alarm, and the few that end while the worker's main
    # loop asks Redis about the one that set it off.
    assert len(single) <= 2 * LEAST, single
    assert failed >= EMAILS, failed  # many more than the lines that say so

    # The server takes mail again: every email goes, and the alarm clears.
    refusing.mail_reply = ""
    wait_until(
        lambda: Delivery.objects.filter(status=Delivery.Status.SENT).count() == EMAILS,
        timeout=30,
    )
    wait_until(lambda: "is over" in alarm_lines(run.output())[-1], timeout=3 * WINDOW)
    assert "FAILURE ALARM" not in status()
    scrape = client.get("/outbox/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert 'outbox_failure_alarm{mailer=""} 0' in scrape.content.decode().splitlines()
    page = admin_client.get(reverse("admin:outbox_dashboard")).content.decode()
    assert "Failure alarm" not in page
    assert run.finish() == 0
    said = alarm_lines(run.output())
    assert sum("is over" in x for x in said) == 1
    assert refusing.count() == EMAILS
