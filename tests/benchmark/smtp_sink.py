"""A loopback SMTP server that waits before answering each message, then accepts it.

    python tests/benchmark/smtp_sink.py PORT DELAY_SECONDS

Runs until SIGTERM/SIGINT. It offers PIPELINING, as Postfix and the ESPs' relays
do (a client that pipelines writes MAIL, RCPT and DATA at once). It counts accepted messages and prints the count on
exit; it does not parse them, so that the server's own cost stays small. With
BENCH_SINK_LOG set, it also appends one line per accepted message to that file:
the time it was accepted (epoch seconds), its first recipient, and when its MAIL
command and the end of its DATA arrived (the latency part's timeline).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

from aiosmtpd.controller import Controller


class Sink:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.count = 0
        path = os.environ.get("BENCH_SINK_LOG")
        self.log = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname  # what aiosmtpd does without this hook
        responses.insert(-1, "250-PIPELINING")  # aiosmtpd reads pipelined commands in order
        return responses

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, mail_options: list[str]
    ) -> str:
        # What aiosmtpd does without this hook, plus the time (a fresh envelope per message).
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        envelope.bench_mail_at = time.time()
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        data_at = time.time()
        if self.delay:
            await asyncio.sleep(self.delay)
        self.count += 1
        if self.log is not None:
            mail_at = getattr(envelope, "bench_mail_at", data_at)
            self.log.write(
                f"{time.time():.6f} {envelope.rcpt_tos[0]} {mail_at:.6f} {data_at:.6f}\n"
            )
        return "250 Message accepted for delivery"


def main() -> None:
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    sink = Sink(delay)
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    controller.stop()
    print(f"accepted {sink.count}", flush=True)


if __name__ == "__main__":
    main()
