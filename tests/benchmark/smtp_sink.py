"""A loopback SMTP server that waits before answering each message, then accepts it.

    python tests/benchmark/smtp_sink.py PORT DELAY_SECONDS

Runs until SIGTERM/SIGINT. It counts accepted messages and prints the count on
exit; it does not parse them, so that the server's own cost stays small. With
BENCH_SINK_LOG set, it also appends one line per accepted message to that file:
the time it arrived (epoch seconds) and its first recipient.
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

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.count += 1
        if self.log is not None:
            self.log.write(f"{time.time():.6f} {envelope.rcpt_tos[0]}\n")
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
