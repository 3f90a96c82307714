"""A rolling upgrade from the previous release, with real processes of both side by side.

The database is migrated by the current release, as a deploy does first. The
previous release (tests/releases.py: built from git history into its own venv)
then serves web requests, runs a worker and a sweeper; the current release's
web, sweeper and worker start beside them; the old ones stop, one by SIGTERM
and one by SIGKILL mid-send (after the mail server took the message), as a
supervisor or an OOM kill would. Every message is written by one release and
may be sent by either: a drop-in message (``EmailMultiAlternatives`` with
headers, an HTML alternative and an attachment), a template message, a
scheduled one, plain ones. Under the default policy ("review"): none lost,
none sent twice, each received as written.

What the current release writes that the previous one cannot handle: a
settled email's content cleared by the sweeper (``sweeper/retention.py``).
The previous release's requeue (its admin) puts such a row back in the queue,
and its worker would send it empty. The current sweeper clears nothing while
a worker of an earlier release is registered (``queue/reliable.py``,
``RELEASE_LEVEL``): the cancelled, sensitive drop-in message below, requeued
by the old web while the old worker runs, must arrive whole, and be cleared
once the old workers are gone. The rest of what differs is shown harmless
here by running it: the new columns (the old inserts take ``sensitive``'s
database default), the squashed migration (the old release finds 0001 to
0018 recorded), the same four PL/pgSQL functions, the failure alarm's Redis
keys and script beside the old scripts, sensitive rows sent by the old worker.
"""

from __future__ import annotations

import email.message
import json
import signal
from collections import Counter
from datetime import datetime
from pathlib import Path

from outbox import enqueue_email
from outbox.models import Delivery, Email, EmailTemplate
from outbox.queue import RedisQueue
from tests.cells import slow_processes
from tests.processes import Run, process_state
from tests.releases import Release, build_previous_release, current_release
from tests.servers import SMTPRecorder, wait_until

pytestmark = slow_processes(
    ("6.1:postgres",),
    why="two releases' processes on one database: PostgreSQL, where the migrations and "
    "functions of both meet; off 5.2:postgres, the cell the test command waits on",
)

Status = Delivery.Status

# A web process of either release: Django set up on the test database, then each
# action of argv[1] ([kind, name, argument]) with that release's public API. It
# prints which outbox it imported and the deliveries of each name.
WEB = r"""
import importlib.util, json, sys
from datetime import timedelta

import django

django.setup()
from django.core.mail import EmailMultiAlternatives
from django.utils import timezone

import outbox
from outbox import enqueue_email, enqueue_template, operations
from outbox.models import Delivery

DATA = bytes(range(256)) * 4


def drop_in(name, argument):
    message = EmailMultiAlternatives(
        subject=f"Drop-in {name}", body=f"Text of {name}.\n", from_email="shop@example.com",
        to=[f"{name}@example.com"], headers={"X-Release-Test": name, "X-Order": "42"},
    )
    message.attach_alternative(f"<p>HTML of {name}</p>", "text/html")
    message.attach("data.bin", DATA, "application/octet-stream")
    if argument == "sensitive, later":
        message.outbox_sensitive = True  # the current release's; cleared once settled
        message.send_at = timezone.now() + timedelta(hours=1)  # anymail's attribute
    message.send()


out = {"outbox": outbox.__file__, "send_at": {}, "ids": {},
       "current": importlib.util.find_spec("outbox.enqueue.sensitive") is not None}
for kind, name, argument in json.loads(sys.argv[1]):
    to = [f"{name}@example.com"]
    if kind == "drop-in":
        drop_in(name, argument)
    elif kind == "template":
        enqueue_template("upgrade", {"name": name}, None, to)
    elif kind == "scheduled":
        due = timezone.now() + timedelta(seconds=argument)
        enqueue_email(f"Scheduled {name}", f"Due later: {name}.\n", None, to, send_at=due)
        out["send_at"][name] = due.isoformat()
    elif kind == "plain":
        enqueue_email(f"Plain {name}", f"Plain {name}.\n", None, to)
    elif kind == "cancel":
        operations.cancel(Delivery.objects.filter(recipient__in=to).values_list("pk", flat=True), "web")
    elif kind == "requeue":  # an operator's requeue in the admin, at once
        ids = list(Delivery.objects.filter(recipient__in=to).values_list("pk", flat=True))
        operations.requeue(ids, "web", send_now=True)
    out["ids"][name] = list(Delivery.objects.filter(recipient__in=to).values_list("pk", flat=True))
print(json.dumps(out))
"""

DATA = bytes(range(256)) * 4


def web(release: Release, *actions: tuple[str, str, object]) -> dict:
    """One request of ``release``'s web process: the actions, in order; what it reports."""
    return json.loads(release.run("-c", WEB, json.dumps(actions)).splitlines()[-1])


class Processes:
    """The test's worker and sweeper processes, each read as it runs; killed at the end."""

    def __init__(self) -> None:
        self.runs: list[Run] = []

    def start(self, release: Release, command: str, *args: str, **env: str) -> Run:
        run = Run(release.start("-m", "django", command, *args, **env))
        self.runs.append(run)
        return run

    def kill_all(self) -> None:
        for run in self.runs:
            run.finish(signal.SIGKILL, timeout=10)


def statuses(*names: str) -> Counter[str]:
    recipients = [f"{name}@example.com" for name in names]
    return Counter(
        Delivery.objects.filter(recipient__in=recipients).values_list("status", flat=True)
    )


def settled(*names: str) -> bool:
    """Every one of ``names`` has its delivery, and none may still be sent."""
    found = statuses(*names)
    return found.total() == len(names) and set(found) <= {
        Status.SENT,
        Status.FAILED,
        Status.ABANDONED,
    }


def received(smtp: SMTPRecorder, name: str) -> email.message.EmailMessage:
    (delivery,) = Delivery.objects.filter(recipient=f"{name}@example.com")
    copies = [r.message for r in list(smtp.received) if r.message_id == delivery.message_id]
    assert len(copies) == 1, f"{name}: {len(copies)} copies received"
    return copies[0]


def text(message: email.message.EmailMessage, kind: str) -> str:
    """The message's ``kind`` text ("plain", "html") with its line ends as written."""
    part = message.get_body((kind,))
    assert part is not None, f"no {kind} part in {message['Subject']}"
    return str(part.get_content()).replace("\r\n", "\n")


def check_drop_in(smtp: SMTPRecorder, name: str) -> None:
    """The drop-in message as its sender wrote it: headers, both texts, the attachment's bytes."""
    message = received(smtp, name)
    assert message["Subject"] == f"Drop-in {name}"
    assert message["X-Release-Test"] == name and message["X-Order"] == "42", name
    assert text(message, "plain") == f"Text of {name}.\n"
    assert text(message, "html").strip() == f"<p>HTML of {name}</p>"
    (attachment,) = list(message.iter_attachments())
    assert attachment.get_filename() == "data.bin"
    assert attachment.get_content() == DATA, name


def check_template(smtp: SMTPRecorder, name: str) -> None:
    message = received(smtp, name)
    assert message["Subject"] == f"Hello {name}"
    assert text(message, "plain").strip() == f"Dear {name}, rendered."
    assert text(message, "html").strip() == f"<b>{name}</b>"


def check_scheduled(smtp: SMTPRecorder, name: str, due: str) -> None:
    message = received(smtp, name)
    assert text(message, "plain") == f"Due later: {name}.\n"
    (delivery,) = Delivery.objects.filter(recipient=f"{name}@example.com")
    assert delivery.sent_at is not None and delivery.sent_at >= datetime.fromisoformat(due)
    # The copy's Date is when it was built: not before its time (to the second).
    assert message["Date"].datetime.timestamp() >= datetime.fromisoformat(due).timestamp() // 1


def senders(*names: str) -> set[str]:
    """Which workers ("old-a", "new-1") sent these names' deliveries (the last to mark each)."""
    recipients = [f"{name}@example.com" for name in names]
    ids = Delivery.objects.filter(recipient__in=recipients).values_list("worker_id", flat=True)
    return {worker_id.split("#")[0] for worker_id in ids}


def test_rolling_upgrade(tmp_path: Path, smtp_server: SMTPRecorder) -> None:
    previous = build_previous_release(tmp_path / "previous")
    current = current_release()
    # The old processes import the old outbox: a module only the current release has is
    # missing there (and found here).
    probe = web(previous)
    assert probe["outbox"].startswith(str(previous.root)) and not probe["current"], probe
    assert web(current)["current"]

    EmailTemplate.objects.create(
        name="upgrade",
        language="",
        subject="Hello {{ name }}",
        text="Dear {{ name }}, rendered.",
        html="<b>{{ name }}</b>",
    )
    smtp = {"OUTBOX_TEST_SMTP_PORT": str(smtp_server.port)}
    processes = Processes()
    try:
        # 1. The previous release alone, on the database the current one migrated.
        old_a = processes.start(
            previous, "outbox_worker", "--worker-id", "old-a", "--concurrency", "2", **smtp
        )
        old_sweeper = processes.start(previous, "outbox_sweep", "--loop", "0.5")
        # The old worker runs the old code too: it registers without a release level.
        queue = RedisQueue()
        wait_until(lambda: [w.split("#")[0] for w in queue.earlier_releases()] == ["old-a"], 30)
        old_1 = web(
            previous,
            ("drop-in", "old1-drop", None),
            ("template", "old1-template", None),
            ("scheduled", "old1-later", 4),
            *[("plain", f"old1-plain{i}", None) for i in range(4)],
        )
        wait_until(lambda: settled("old1-drop", "old1-template", "old1-plain0"), 30)

        # 2. The current web and sweeper start; the old sweeper stops. The current web
        # writes a sensitive message and cancels it: settled, its content may go.
        new_2 = web(
            current,
            ("drop-in", "new2-drop", None),
            ("template", "new2-template", None),
            ("scheduled", "new2-later", 4),
            ("drop-in", "new2-secret", "sensitive, later"),
            ("cancel", "new2-secret", None),
        )
        assert statuses("new2-secret") == {Status.CANCELLED: 1}
        new_sweeper = processes.start(current, "outbox_sweep", "--loop", "0.5")
        assert old_sweeper.finish(signal.SIGTERM) == 0, old_sweeper.output()
        secret = Email.objects.get(deliveries__recipient="new2-secret@example.com")

        def content_kept_or_cleared() -> bool:
            secret.refresh_from_db()
            return secret.content_cleared_at is not None or "earlier release" in (
                new_sweeper.output()
            )

        wait_until(content_kept_or_cleared, 20)
        # An operator requeues it in the old admin, while the old worker runs.
        web(
            previous,
            ("requeue", "new2-secret", None),
            ("drop-in", "old3-drop", None),
            ("template", "old3-template", None),
        )
        # Everything so far settled (the scheduled ones too): the old worker below can
        # only take the rows written for it.
        wait_until(lambda: settled(*old_1["ids"], *new_2["ids"], "old3-drop", "old3-template"), 30)
        assert old_a.proc.poll() is None, old_a.output()

        # 3. An old worker its supervisor restarted mid-deploy is killed mid-send: the
        # mail server has the message, the row is still processing.
        old_b = processes.start(
            previous,
            "outbox_worker",
            "--worker-id",
            "old-b",
            OUTBOX_FAULT_POINT="after_send",
            OUTBOX_FAULT_COUNT="1",
            **smtp,
        )
        victims: list[str] = []

        def old_b_stopped_mid_send() -> bool:
            if process_state(old_b.proc) == "T":
                return True
            victims.append(f"new3-plain{len(victims)}")
            enqueue_email("Plain", "Plain.\n", None, [f"{victims[-1]}@example.com"])
            return False

        wait_until(old_b_stopped_mid_send, 30, interval=0.3)
        old_b.finish(signal.SIGKILL)

        # 4. The current worker starts beside the old one, which then stops (SIGTERM)
        # with mail in hand; both webs enqueue meanwhile.
        new_1 = processes.start(
            current, "outbox_worker", "--worker-id", "new-1", "--concurrency", "2", **smtp
        )
        wait_until(lambda: any(w.startswith("new-1#") for w in queue.live_workers()), 30)
        assert not any(w.startswith("new-1#") for w in queue.earlier_releases())
        old_4 = web(
            previous,
            ("drop-in", "old4-drop", None),
            ("template", "old4-template", None),
            *[("plain", f"old4-plain{i}", None) for i in range(6)],
        )
        assert old_a.finish(signal.SIGTERM) == 0, old_a.output()
        new_5 = web(
            current,
            ("drop-in", "new5-drop", None),
            ("template", "new5-template", None),
            ("scheduled", "new5-later", 3),
        )
        names = [
            name
            for report in (old_1, new_2, old_4, new_5)
            for name in report["ids"]
            if name != "new2-secret"
        ] + ["new2-secret", "old3-drop", "old3-template", *victims]
        wait_until(lambda: settled(*names), 60)
        # Once no old worker is left, the sensitive message's content goes.
        wait_until(lambda: Email.objects.get(pk=secret.pk).content_cleared_at is not None, 20)
        assert new_1.proc.poll() is None, new_1.output()
    finally:
        processes.kill_all()

    # None lost, none twice: every delivery's message arrived once, and nothing else did.
    deliveries = Delivery.objects.all()
    assert Counter(d.status for d in deliveries) == {
        Status.SENT: len(deliveries) - 1,
        Status.ABANDONED: 1,  # the killed worker's, left for review: it had been sent
    }
    abandoned = Delivery.objects.get(status=Status.ABANDONED)
    assert abandoned.recipient in [f"{name}@example.com" for name in victims]
    assert abandoned.worker_id.startswith("old-b#")
    counts = smtp_server.by_message_id()
    assert sorted(counts.values()) == [1] * len(deliveries)
    assert set(counts) == {d.message_id for d in deliveries}

    # Each as written, whichever release wrote it and whichever sent it.
    for name in ("old1-drop", "new2-drop", "new2-secret", "old3-drop", "old4-drop", "new5-drop"):
        check_drop_in(smtp_server, name)
    for name in (
        "old1-template",
        "new2-template",
        "old3-template",
        "old4-template",
        "new5-template",
    ):
        check_template(smtp_server, name)
    for report in (old_1, new_2, new_5):
        for name, due in report["send_at"].items():
            check_scheduled(smtp_server, name, due)
    # The current sweeper said whom it waited for before it cleared the sensitive content.
    assert "content retention waits: workers of an earlier release are running (old-a#" in (
        new_sweeper.output()
    )
    # Rows of each release were sent by workers of each.
    assert senders("new2-drop", "new2-template", "new2-secret") == {"old-a"}
    assert "new-1" in senders("new5-drop", "new5-template", "new5-later")
    assert "old-a" in senders("old1-drop", "old1-template")
