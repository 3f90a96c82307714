"""Traces (outbox/tracing.py): the request that enqueues and the worker's send are one trace.

The request runs here, through Django's test client, in a span of an SDK
TracerProvider of the test's own (as OpenTelemetry's Django instrumentation
would open one; never this process's global provider, which would outlive the
module and trace every later test); a real ``outbox_worker`` subprocess sends,
its SDK TracerProvider set up by a ``sitecustomize`` on its PYTHONPATH,
writing each span as JSON to a file as it ends (the SDK's ConsoleSpanExporter).
The settlements made outside the worker run in processes traced the same way:
an operator's action, an ``outbox_sweep`` process, and a ``runserver`` taking an
ESP's event on anymail's tracking view. Without OpenTelemetry (its import
blocked by another ``sitecustomize``), a process enqueues and a worker sends as
before, and nothing is stored.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import enqueue_email, enqueue_many
from outbox.models import Delivery, Email
from tests.cells import BOTH_DATABASES, slow_processes
from tests.delivery import use_outbox
from tests.esp import (
    HEARTBEATS,
    POSTMARK_BACKEND,
    FakeESP,
    basic_auth,
    postmark_event,
    worker_env,
)
from tests.servers import SMTPRecorder, runserver, subprocess_env, wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = slow_processes(
    BOTH_DATABASES,
    why="the stored context on both enqueue paths of each database, and real worker processes",
)

Status = Delivery.Status

# A process's TracerProvider: the SDK's, each span written as one line of JSON.
TRACED = """
import os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

_out = open(os.environ["OUTBOX_TEST_SPANS"], "a", buffering=1)
_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\\n")
    )
)
trace.set_tracer_provider(_provider)
"""

# OpenTelemetry not installed, as far as the process can tell.
ABSENT = """
import sys
sys.modules["opentelemetry"] = None
"""


class Requests:
    """The request side: a TracerProvider of the test's own, its spans kept in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = self.provider.get_tracer("tests")

    def request(self, name: str) -> Any:
        """A SERVER span, as OpenTelemetry's Django instrumentation opens around a request."""
        return self.tracer.start_as_current_span(name, kind=trace.SpanKind.SERVER)


@pytest.fixture
def requests() -> Iterator[Requests]:
    side = Requests()
    yield side
    side.provider.shutdown()


def site(tmp_path: Path, name: str, code: str) -> dict[str, str]:
    """Environment for a subprocess that runs ``code`` at its start (a sitecustomize)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(code)
    path = subprocess_env().get("PYTHONPATH")
    return {"PYTHONPATH": f"{folder}:{path}" if path else str(folder)}


def traced(tmp_path: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A spans file, and the environment of a process that writes its spans there."""
    out = tmp_path / f"{name}.jsonl"
    return out, {"OUTBOX_TEST_SPANS": str(out), **site(tmp_path, name, TRACED)}


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_worker(worker_process, smtp: SMTPRecorder, env: dict[str, str]) -> None:
    """A burst worker subprocess: everything due is sent, then it exits 0."""
    proc = worker_process("--burst", OUTBOX_TEST_SMTP_PORT=str(smtp.port), **env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out


def manage(env: dict[str, str], code: str) -> None:
    """``manage.py shell -c code`` on the test database."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def trace_hex(span: ReadableSpan) -> str:
    """The span's trace id as the SDK's JSON writes it."""
    return f"0x{span.get_span_context().trace_id:032x}"


def span_hex(span: ReadableSpan) -> str:
    return f"0x{span.get_span_context().span_id:016x}"


def named(found: list[dict[str, Any]], name: str) -> dict[int, list[dict[str, Any]]]:
    """The spans called ``name``, by their delivery id, in the order they ended."""
    out: dict[int, list[dict[str, Any]]] = {}
    for span in found:
        if span["name"] == name:
            out.setdefault(span["attributes"]["outbox.delivery.id"], []).append(span)
    return out


def no_address(span: dict[str, Any], *addresses: str) -> None:
    """No attribute of the span, nor of its events, holds an address."""
    values = [*span["attributes"].values()]
    for event in span["events"]:
        values += event["attributes"].values()
    for value in values:
        for address in addresses:
            assert address not in str(value), (address, span)


def test_the_request_and_the_send_are_one_trace(
    settings, client, requests, worker_process, tmp_path
) -> None:
    use_outbox(settings)
    User.objects.create_user("alice", "alice@example.com", "password-1")
    with requests.request("POST /accounts/password_reset/"):
        # Django's send_mail through the drop-in backend ...
        response = client.post("/accounts/password_reset/", {"email": "alice@example.com"})
        assert response.status_code == 302
    with requests.request("POST /enqueue/"):
        # ... enqueue_email (the ORM path on PostgreSQL too: the function has no such argument),
        response = client.post("/enqueue/", {"to": "Bob <bob@example.net>"})
        assert response.status_code == 200
    with requests.tracer.start_as_current_span("signup batch"):
        # ... and enqueue_many's statement; this recipient is refused for now: a retry.
        item = {"subject": "Hi", "message": "b", "recipient_list": ["carol@example.org"]}
        [[carol]] = enqueue_many([item])
    # Outside a span that records: nothing stored, and its send is a trace of its own.
    [dave] = enqueue_email("Untraced", "b", None, ["dave@example.com"])

    parents = {s.name: s for s in requests.spans.get_finished_spans()}
    reset = Delivery.objects.get(recipient="alice@example.com")
    bob = Delivery.objects.get(recipient="Bob <bob@example.net>")
    parent_of = {
        reset.pk: parents["POST /accounts/password_reset/"],
        bob.pk: parents["POST /enqueue/"],
        carol.pk: parents["signup batch"],
    }
    for pk, parent in parent_of.items():
        context = parent.get_span_context()
        ids = f"{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        assert Email.objects.get(deliveries=pk).trace_context == {"traceparent": f"00-{ids}"}
    assert Email.objects.get(deliveries=dave.pk).trace_context is None

    smtp = SMTPRecorder(refuse={"carol@example.org": "451 try later"}).start()
    try:
        out, env = traced(tmp_path, "worker")
        run_worker(worker_process, smtp, env)
    finally:
        smtp.stop()
    sends = named(read_spans(out), "outbox send")
    assert set(sends) == {reset.pk, bob.pk, carol.pk, dave.pk}
    for pk, parent in parent_of.items():
        first = sends[pk][0]
        assert first["context"]["trace_id"] == trace_hex(parent)
        assert first["parent_id"] == span_hex(parent)
        assert first["kind"] == "SpanKind.CLIENT"
        assert first["attributes"]["outbox.attempt"] == 1
        assert first["attributes"]["outbox.email.id"] == Email.objects.get(deliveries=pk).pk
    for span in [s for spans in sends.values() for s in spans]:
        assert span["attributes"]["outbox.mailer"] == ""  # the worker's default
        no_address(
            span, "alice@example.com", "bob@example.net", "carol@example.org", "dave@example.com"
        )
    assert sends[reset.pk][0]["attributes"]["outbox.recipient.domain"] == "example.com"
    assert sends[bob.pk][0]["attributes"]["outbox.recipient.domain"] == "example.net"
    for pk in (reset.pk, bob.pk):
        [span] = sends[pk]
        assert span["attributes"]["outbox.outcome"] == "sent"
        assert span["attributes"]["server.address"]
        assert span["events"] == []
    retried = sends[carol.pk][0]
    assert retried["attributes"]["outbox.outcome"] == "retry"
    [event] = retried["events"]
    assert event["name"] == "outbox retry" and event["attributes"]["outbox.retry_at"]
    [untraced] = sends[dave.pk]
    assert untraced["parent_id"] is None
    assert untraced["context"]["trace_id"] not in {trace_hex(p) for p in parent_of.values()}


def test_a_delivery_in_doubt_and_an_operators_settlement_are_on_its_trace(
    requests, worker_process, tmp_path
) -> None:
    with requests.request("POST /order/"):
        [row] = enqueue_email("Receipt", "b", None, ["erin@example.org"])
    [parent] = requests.spans.get_finished_spans()

    # The connection is cut after the final dot: in doubt, abandoned for review.
    smtp = SMTPRecorder(after_data="cut").start()
    try:
        out, env = traced(tmp_path, "worker")
        run_worker(worker_process, smtp, env)
    finally:
        smtp.stop()
    assert Delivery.objects.get(pk=row.pk).status == Status.ABANDONED
    [send] = named(read_spans(out), "outbox send")[row.pk]
    assert send["attributes"]["outbox.outcome"] == "ambiguous"
    assert [e["name"] for e in send["events"]] == ["outbox ambiguous"]
    assert send["parent_id"] == span_hex(parent)

    # An operator marks it sent (the admin's action calls the same function).
    out, env = traced(tmp_path, "operator")
    manage(env, f"from outbox import operations; operations.mark_sent([{row.pk}], 'admin:alice')")
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT
    [settled] = read_spans(out)
    assert settled["name"] == "outbox marked_sent"
    assert settled["context"]["trace_id"] == trace_hex(parent)
    assert settled["parent_id"] == span_hex(parent)
    assert settled["attributes"] == {
        "outbox.delivery.id": row.pk,
        "outbox.recipient.domain": "example.org",
        "outbox.mailer": "",
        "outbox.attempt": 1,
        "outbox.outcome": "marked_sent",
        "outbox.actor": "admin",  # the operator's name stays out
    }


def test_the_sweepers_abandonment_and_an_esp_events_settlement_are_on_its_trace(
    esp: FakeESP, requests, worker_process, sweeper_process, tmp_path
) -> None:
    esp.reset()
    with requests.request("POST /invite/"):
        [row] = enqueue_email("Invitation", "b", None, ["killed@example.com"])
    [parent] = requests.spans.get_finished_spans()

    # The ESP takes the message and does not answer in time; the worker dies meanwhile.
    esp.answer_after = 30.0
    esp.plan["killed@example.com"] = ["slow"]
    review = {"OUTBOX_TEST_ABANDONED_POLICY": "review", **HEARTBEATS}
    worker = worker_process(
        "--concurrency", "1", **worker_env(esp, 30.0, POSTMARK_BACKEND, **review)
    )
    wait_until(lambda: esp.accepted_for("killed@example.com"), 20)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    # A sweeper declares it dead: the row is abandoned for review.
    swept, env = traced(tmp_path, "sweeper")
    sweeper = sweeper_process("--loop", "0.3", **review, **env)
    wait_until(lambda: Delivery.objects.get(pk=row.pk).status == Status.ABANDONED, 20)
    sweeper.terminate()
    sweeper.wait(timeout=30)
    # The ESP's Delivery event, posted to anymail's tracking view: the row is settled sent.
    [taken] = esp.accepted_for("killed@example.com")
    webhook, env = traced(tmp_path, "web")
    with runserver(tmp_path / "runserver.log", **env) as port:
        answer = urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{port}/anymail/postmark/tracking/",
                data=json.dumps(postmark_event(taken)).encode(),
                headers={"Content-Type": "application/json", "Authorization": basic_auth()},
            ),
            timeout=30,
        )
        assert answer.status == 200
        wait_until(lambda: read_spans(webhook), 10)
    assert Delivery.objects.get(pk=row.pk).status == Status.SENT

    [abandoned] = named(read_spans(swept), "outbox abandoned")[row.pk]
    [settled] = named(read_spans(webhook), "outbox marked_sent")[row.pk]
    assert abandoned["attributes"]["outbox.actor"] == "sweeper"
    assert settled["attributes"]["outbox.actor"] == "esp"  # esp:Postmark
    for span in (abandoned, settled):
        assert span["context"]["trace_id"] == trace_hex(parent)
        assert span["parent_id"] == span_hex(parent)
        assert span["attributes"]["outbox.recipient.domain"] == "example.com"
        no_address(span, "killed@example.com")


def test_without_opentelemetry_enqueue_and_send_work_and_nothing_is_stored(
    worker_process, tmp_path
) -> None:
    absent = site(tmp_path, "absent", ABSENT)
    manage(
        absent,
        """
        import sys
        from django.core.mail import send_mail
        from outbox import enqueue_email, tracing
        assert tracing.trace is None and sys.modules["opentelemetry"] is None
        enqueue_email("Plain", "b", None, ["frank@example.com"])
        send_mail("Drop-in", "b", None, ["grace@example.com"])
        """,
    )
    assert list(Email.objects.values_list("trace_context", flat=True)) == [None, None]

    smtp = SMTPRecorder().start()
    try:
        run_worker(worker_process, smtp, absent)
        received = sorted(r for m in smtp.received for r in m.rcpt_tos)
    finally:
        smtp.stop()
    assert received == ["frank@example.com", "grace@example.com"]
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SENT}
