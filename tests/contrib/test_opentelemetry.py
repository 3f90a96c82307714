"""Traces (outbox/tracing.py): the request that enqueues and the worker's send are one trace.

The request runs here, through Django's test client, in a span of this
process's SDK TracerProvider (as OpenTelemetry's Django instrumentation would
open one); a real ``outbox_worker`` subprocess sends, its own SDK
TracerProvider set up by a ``sitecustomize`` on its PYTHONPATH, writing each
span as JSON to a file as it ends (the SDK's ConsoleSpanExporter). Without
OpenTelemetry (its import blocked by another ``sitecustomize``), a process
enqueues and a worker sends as before, and nothing is stored.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import enqueue_email, enqueue_many, operations
from outbox.models import Delivery, Email
from tests.cells import BOTH_DATABASES, slow_processes
from tests.delivery import use_outbox
from tests.servers import SMTPRecorder, subprocess_env

ROOT = Path(__file__).resolve().parents[2]

pytestmark = slow_processes(
    BOTH_DATABASES,
    why="the stored context on both enqueue paths of each database, and real worker processes",
)

# The worker's TracerProvider: the SDK's, each span written as one line of JSON.
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


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """This process's spans: the request's, and the settlements made here."""
    spans = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield spans
    spans.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


def site(tmp_path: Path, name: str, code: str) -> dict[str, str]:
    """Environment for a subprocess that runs ``code`` at its start (a sitecustomize)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(code)
    path = subprocess_env().get("PYTHONPATH")
    return {"PYTHONPATH": f"{folder}:{path}" if path else str(folder)}


def run_worker(worker_process, smtp: SMTPRecorder, env: dict[str, str]) -> str:
    """A burst worker subprocess: everything due is sent, then it exits 0."""
    proc = worker_process("--burst", OUTBOX_TEST_SMTP_PORT=str(smtp.port), **env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hex_id(value: int) -> str:
    """An id as the SDK's JSON writes it."""
    return f"0x{value:032x}" if value >= 1 << 64 else f"0x{value:016x}"


def by_delivery(found: list[dict[str, Any]], name: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for span in found:
        if span["name"] == name:
            out.setdefault(span["attributes"]["outbox.delivery.id"], []).append(span)
    return out


def no_address(attributes: dict[str, Any], addresses: list[str]) -> None:
    for value in attributes.values():
        for address in addresses:
            assert address not in str(value), (address, attributes)


def test_the_request_and_the_send_are_one_trace(
    settings, client, spans, worker_process, tmp_path
) -> None:
    use_outbox(settings)
    User.objects.create_user("alice", "alice@example.com", "password-1")
    tracer = trace.get_tracer("tests")
    # As OpenTelemetry's Django instrumentation would: a SERVER span around each request.
    with tracer.start_as_current_span("POST /accounts/password_reset/", kind=trace.SpanKind.SERVER):
        # Django's send_mail through the drop-in backend ...
        response = client.post("/accounts/password_reset/", {"email": "alice@example.com"})
        assert response.status_code == 302
    with tracer.start_as_current_span("POST /enqueue/", kind=trace.SpanKind.SERVER):
        # ... enqueue_email (the ORM path on PostgreSQL too: the function has no such argument),
        response = client.post("/enqueue/", {"to": "Bob <bob@example.net>"})
        assert response.status_code == 200
    with tracer.start_as_current_span("signup batch"):
        # ... and enqueue_many's statement; this recipient is refused for now: a retry.
        [[carol]] = enqueue_many(
            [
                {
                    "subject": "Hi",
                    "message": "b",
                    "from_email": None,
                    "recipient_list": ["carol@example.org"],
                }
            ]
        )
    # No span that records, nothing stored: its send has a trace of its own.
    [dave] = enqueue_email("Untraced", "b", None, ["dave@example.com"])

    request_spans = {s.name: s for s in spans.get_finished_spans()}
    reset = Delivery.objects.get(recipient="alice@example.com")
    bob = Delivery.objects.get(recipient="Bob <bob@example.net>")
    expected_parent = {
        reset.pk: request_spans["POST /accounts/password_reset/"],
        bob.pk: request_spans["POST /enqueue/"],
        carol.pk: request_spans["signup batch"],
    }
    for pk, parent in expected_parent.items():
        stored = Email.objects.get(deliveries=pk).trace_context
        context = parent.get_span_context()
        ids = f"{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        assert stored == {"traceparent": f"00-{ids}"}
    assert Email.objects.get(deliveries=dave.pk).trace_context is None

    smtp = SMTPRecorder(refuse={"carol@example.org": "451 try later"}).start()
    try:
        out = tmp_path / "spans.jsonl"
        run_worker(
            worker_process,
            smtp,
            {"OUTBOX_TEST_SPANS": str(out), **site(tmp_path, "traced", TRACED)},
        )
    finally:
        smtp.stop()
    sends = by_delivery(read_spans(out), "outbox send")
    assert set(sends) == {reset.pk, bob.pk, carol.pk, dave.pk}
    addresses = ["alice@example.com", "bob@example.net", "carol@example.org", "dave@example.com"]
    for pk, parent in expected_parent.items():
        first = sends[pk][0]
        context = parent.get_span_context()
        assert first["context"]["trace_id"] == hex_id(context.trace_id)
        assert first["parent_id"] == hex_id(context.span_id)
        assert first["kind"] == "SpanKind.CLIENT"
        assert first["attributes"]["outbox.attempt"] == 1
        assert first["attributes"]["outbox.mailer"] == Email.objects.get(deliveries=pk).mailer
        for span in sends[pk]:
            no_address(span["attributes"], addresses)
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
    # The untraced email's send: a root span, on a trace of its own.
    [untraced] = sends[dave.pk]
    assert untraced["parent_id"] is None
    assert untraced["context"]["trace_id"] not in {
        hex_id(p.get_span_context().trace_id) for p in expected_parent.values()
    }


def test_an_abandoned_delivery_and_its_settlement_are_on_its_trace(
    settings, spans, worker_process, tmp_path
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /order/", kind=trace.SpanKind.SERVER) as request:
        [delivery] = enqueue_email("Receipt", "b", None, ["erin@example.org"])
    context = request.get_span_context()
    spans.clear()

    # The connection is cut after the final dot: in doubt, abandoned for review.
    smtp = SMTPRecorder(after_data="cut").start()
    try:
        out = tmp_path / "spans.jsonl"
        run_worker(
            worker_process,
            smtp,
            {"OUTBOX_TEST_SPANS": str(out), **site(tmp_path, "traced", TRACED)},
        )
    finally:
        smtp.stop()
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.ABANDONED
    [send] = by_delivery(read_spans(out), "outbox send")[delivery.pk]
    assert send["attributes"]["outbox.outcome"] == "ambiguous"
    assert [e["name"] for e in send["events"]] == ["outbox ambiguous"]
    assert send["parent_id"] == hex_id(context.span_id)

    # An operator marks it sent (the admin's action): a span on the same trace.
    assert operations.mark_sent([delivery.pk], "admin:alice").changed == [delivery.pk]
    [settled] = spans.get_finished_spans()
    assert settled.name == "outbox marked_sent"
    assert settled.context.trace_id == context.trace_id
    assert settled.parent is not None and settled.parent.span_id == context.span_id
    assert dict(settled.attributes or {}) == {
        "outbox.delivery.id": delivery.pk,
        "outbox.recipient.domain": "example.org",
        "outbox.mailer": "",
        "outbox.attempt": 1,
        "outbox.outcome": "marked_sent",
        "outbox.actor": "admin",  # the user's name stays out
    }


def test_without_opentelemetry_enqueue_and_send_work_and_nothing_is_stored(
    worker_process, tmp_path
) -> None:
    env = subprocess_env(**site(tmp_path, "absent", ABSENT))
    enqueue = textwrap.dedent(
        """
        import sys
        from django.core.mail import send_mail
        from outbox import enqueue_email, tracing
        assert tracing.trace is None and sys.modules["opentelemetry"] is None
        enqueue_email("Plain", "b", None, ["frank@example.com"])
        send_mail("Drop-in", "b", None, ["grace@example.com"])
        """
    )
    done = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", enqueue],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert Email.objects.count() == 2
    assert list(Email.objects.values_list("trace_context", flat=True)) == [None, None]

    smtp = SMTPRecorder().start()
    try:
        run_worker(worker_process, smtp, site(tmp_path, "absent-worker", ABSENT))
        assert sorted(r for m in smtp.received for r in m.rcpt_tos) == [
            "frank@example.com",
            "grace@example.com",
        ]
    finally:
        smtp.stop()
    assert set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.SENT}
