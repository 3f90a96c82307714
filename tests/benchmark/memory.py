"""The benchmark's memory part (issue 41): one worker's RSS before and after many emails.

``--only memory`` writes ``--memory-emails`` distinct emails of realistic size
(a text part, an HTML part and a small PDF-like attachment, each email its
own, so no two share a cache entry), then one ``outbox_worker --burst
--concurrency 4`` sends them all through :class:`SerializingBackend`, which
serialises each copy as SMTP would and keeps nothing. The worker's RSS is
read from ``/proc/<pid>/status`` every half second; the report gives it once
the first 1,000 were sent (imports, connections and the first cache entries
done), its peak, and its last reading.

Each Python named in ``BENCH_WORKER_PYTHONS`` (comma-separated, default this
one) runs the worker in turn, so one run measures Django 5.2 and 6.1 side by
side: e.g. ``BENCH_WORKER_PYTHONS=.venv/bin/python,.venv-django61/bin/python``
(the test command's virtual environments; ``BENCH_OUTBOX_ONLY`` leaves the
other systems out of INSTALLED_APPS for them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend

from tests.benchmark.common import ROOT

CONCURRENCY = 4
WARM = 1_000
TEXT = "Hello,\n\nYour order has shipped. " + "Here is what you ordered. " * 60
HTML = "<html><body>" + "<p>Your order has shipped: <b>item</b></p>" * 120 + "</body></html>"
ATTACHMENT = 4_000  # bytes: a small receipt


class SerializingBackend(BaseEmailBackend):
    """Serialises every message as a mail server would receive it, then drops it."""

    def send_messages(self, email_messages: Any) -> int:
        for message in email_messages:
            message.message().as_bytes()
        return len(email_messages)


def rss_kib(pid: int) -> int | None:
    """The process's resident set (KiB), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class MemoryMixin:
    """The memory part of the benchmark's ``Child`` (see child.py)."""

    db: str
    extra: dict[str, Any]

    def bench_memory(self) -> None:
        n = self.sizes.memory_emails  # type: ignore[attr-defined]
        pythons = [p for p in os.environ.get("BENCH_WORKER_PYTHONS", "").split(",") if p]
        results = []
        for python in pythons or [sys.executable]:
            self.reset()  # type: ignore[attr-defined]
            self._write(n)
            results.append(self._drain(python, n))
            self.log(f"memory: {results[-1]}")  # type: ignore[attr-defined]
        self.extra["memory"] = {"emails": n, "concurrency": CONCURRENCY, "runs": results}

    def _write(self, n: int) -> None:
        """``n`` emails, each with its own content and attachment, one recipient each."""
        from django.db import connection

        from outbox.models import Attachment, Delivery, Email
        from outbox.sweeper import Sweeper

        chunk = 2_000
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            emails = Email.objects.bulk_create(
                Email(
                    subject=f"Your order #{start + i} has shipped",
                    body=TEXT + f"\nOrder {start + i}\n",
                    html_message=HTML + f"<!-- {start + i} -->",
                    from_email="shop@example.com",
                )
                for i in range(count)
            )
            Attachment.objects.bulk_create(
                Attachment(
                    email=email,
                    name=f"receipt-{email.pk}.pdf",
                    content=os.urandom(ATTACHMENT),
                    mimetype="application/pdf",
                )
                for email in emails
            )
            Delivery.objects.bulk_create(
                Delivery(
                    email=email,
                    recipient=f"buyer{email.pk}@example.com",
                    recipient_key=f"buyer{email.pk}@example.com",
                    message_id=f"<order-{email.pk}@example.com>",
                )
                for email in emails
            )
        connection.close()
        Sweeper().run_pass(full_mirror_check=True)  # pushes every queued row
        self.log(f"memory: {n} emails written in {time.perf_counter() - t0:.0f}s")  # type: ignore[attr-defined]

    def _drain(self, python: str, n: int) -> dict[str, Any]:
        from django.db import connection

        from outbox.models import Delivery

        env = self.env("serialize")  # type: ignore[attr-defined]
        env["BENCH_OUTBOX_ONLY"] = "1"
        cmd = [python, "-m", "django", "outbox_worker", "--burst"]
        cmd += ["--concurrency", str(CONCURRENCY)]
        version = subprocess.run(
            [python, "-c", "import django; print(django.get_version())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        t0 = time.perf_counter()
        worker = subprocess.Popen(cmd, env=env, cwd=ROOT)
        warm = peak = last = 0
        quarters: dict[int, float] = {}  # 25, 50, 75 (% sent) -> RSS MiB
        next_count = 0.0
        while worker.poll() is None:
            rss = rss_kib(worker.pid)
            if rss is not None:
                peak, last = max(peak, rss), rss
            now = time.perf_counter()
            if now >= next_count:
                sent = Delivery.objects.filter(status=Delivery.Status.SENT).count()
                next_count = now + 1.0
                if not warm and sent >= WARM:
                    warm = last
                for q in (25, 50, 75):
                    if q not in quarters and sent * 100 >= n * q:
                        quarters[q] = round(last / 1024, 1)
            time.sleep(0.5)
        elapsed = time.perf_counter() - t0
        sent = Delivery.objects.filter(status=Delivery.Status.SENT).count()
        connection.close()
        return {
            "django": version,
            "sent": sent,
            "seconds": round(elapsed, 1),
            "exit": worker.returncode,
            "rss_after_warm_mib": round(warm / 1024, 1),
            "rss_by_quarter_mib": [quarters.get(q) for q in (25, 50, 75)],
            "rss_peak_mib": round(peak / 1024, 1),
            "rss_last_mib": round(last / 1024, 1),
        }


def memory_section(db: str, memory: Any) -> list[str]:
    """The report's lines for the memory part."""
    if not memory:
        return []
    md = [
        f"## A worker's memory ({db})",
        "",
        f"{memory['emails']:,} distinct emails (text {len(TEXT):,} chars, HTML {len(HTML):,}, "
        f"a {ATTACHMENT:,}-byte attachment), one `outbox_worker --burst --concurrency "
        f"{memory['concurrency']}`, each copy serialised as SMTP would (tests/benchmark/memory.py). "
        f"RSS once {WARM:,} were sent, once a quarter, half and three quarters were, at its "
        "peak, and at its last reading (as it exits).",
        "",
        "| Django | sent | time | RSS after 1,000 | at 25% | at 50% | at 75% | peak | last |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in memory["runs"]:
        quarters = " | ".join(f"{q} MiB" for q in r.get("rss_by_quarter_mib", [None] * 3))
        md.append(
            f"| {r['django']} | {r['sent']:,} | {r['seconds']:.0f} s | "
            f"{r['rss_after_warm_mib']} MiB | {quarters} | {r['rss_peak_mib']} MiB | "
            f"{r['rss_last_mib']} MiB |"
        )
    md.append("")
    return md
