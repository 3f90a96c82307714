"""The sendmail backend: deliver by piping each message to a sendmail binary.

Apart from the outbox's SMTP path because it is a complete backend of its own
(process handling, its time limit, exit statuses); it is re-exported as
``outbox.backends.SendmailBackend``, the dotted path projects configure.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Sequence
from email.utils import parseaddr
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage

from ..conf import outbox_settings
from ..exceptions import AmbiguousDeliveryError, DeliveryError

EX_TEMPFAIL = 75  # sysexits.h: "try again later"


def envelope_address(value: str) -> str:
    """The bare ``local@domain`` of an address, domain IDNA-encoded."""
    address = parseaddr(value)[1] or value
    local, _, domain = address.rpartition("@")
    try:
        domain = domain.encode("idna").decode("ascii")
    except UnicodeError:
        pass  # leave it; the mail server will refuse it and say why
    return f"{local}@{domain}" if local else address


class SendmailBackend(BaseEmailBackend):
    """Pipe each message to a sendmail binary, never through a shell.

    Called as ``sendmail -oi -f <envelope sender> -- <recipients...>`` with the
    message on standard input. Exit status 75 (``EX_TEMPFAIL``) is a transient
    failure (the worker retries); any other non-zero status is permanent. Both
    carry sendmail's standard error in the message.

    The child gets ``timeout`` seconds in all, to read the message and exit;
    then it is killed. A child that was killed (by the time limit or by a
    signal) after it had been given the whole message, its standard input
    written and closed, may have queued it: that raises
    :class:`~outbox.exceptions.AmbiguousDeliveryError`. Killed while the
    message was still being written, it cannot have it: a transient failure.

    Options (``OPTIONS`` of a Django 6.1 mailer, or keyword arguments):
    ``sendmail_path`` (default ``OUTBOX["SENDMAIL_PATH"]``), ``timeout``
    seconds (default ``OUTBOX["SEND_TIMEOUT"]``).
    """

    # How much of sendmail's standard error is kept for the error message.
    STDERR_LIMIT = 64 * 1024

    def __init__(
        self,
        sendmail_path: str | None = None,
        timeout: float | None = None,
        fail_silently: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Our own attribute: Django 6.1 deprecates the base class's.
        self.fail_silently = fail_silently
        self.sendmail_path = sendmail_path or outbox_settings.SENDMAIL_PATH
        self.timeout = outbox_settings.SEND_TIMEOUT if timeout is None else float(timeout)

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        sent = 0
        for message in email_messages:
            try:
                if self._send(message):
                    sent += 1
            except DeliveryError:
                if not self.fail_silently:
                    raise
        return sent

    def _send(self, message: EmailMessage) -> bool:
        recipients = message.recipients()
        if not recipients:
            return False
        # The envelope carries bare addresses: a display name in `-f` or a
        # recipient argument would reach MAIL FROM / RCPT TO verbatim in some
        # sendmail implementations.
        sender = envelope_address(message.from_email)
        envelope = [envelope_address(addr) for addr in recipients]
        parsed = message.message()
        data = parsed.as_bytes()
        message_id = str(parsed["Message-ID"] or "") or None
        command = [self.sendmail_path, "-oi", "-f", sender, "--", *envelope]
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise DeliveryError(f"cannot run {self.sendmail_path}: {exc}") from exc
        try:
            handed_over, stderr_bytes, timed_out = self._communicate(proc, data)
        finally:
            if proc.poll() is None:
                proc.kill()  # this child only, by its Popen object
            proc.wait()
            for stream in (proc.stdin, proc.stderr):
                if stream is not None:
                    stream.close()
        stderr = stderr_bytes.decode("utf-8", "replace").strip()
        status = proc.returncode
        if timed_out or status < 0:
            how = (
                f"timed out after {self.timeout:g}s and was killed"
                if timed_out
                else f"was killed by signal {-status}"
            )
            detail = f": {stderr}" if stderr else ""
            if handed_over:
                raise AmbiguousDeliveryError(
                    f"sendmail {how} after it was given the whole message{detail}",
                    message_id=message_id,
                )
            raise DeliveryError(f"sendmail {how} before it had read the message{detail}")
        if status == 0:
            return True
        raise DeliveryError(
            f"sendmail exited with status {status}: {stderr}",
            permanent=status != EX_TEMPFAIL,
        )

    def _communicate(self, proc: subprocess.Popen[bytes], data: bytes) -> tuple[bool, bytes, bool]:
        """Write ``data`` to the child and read its standard error, within the time limit.

        Returns (whether all of ``data`` was written and stdin closed, the
        standard error read, whether the time limit passed). Unlike
        ``Popen.communicate()``, this says how far the writing got, which is
        what decides between a retry and a message in doubt.
        """
        assert proc.stdin is not None and proc.stderr is not None
        deadline = time.monotonic() + self.timeout
        stdin_fd, stderr_fd = proc.stdin.fileno(), proc.stderr.fileno()
        # Non-blocking writes: a child that stops reading must not block us
        # past the deadline.
        os.set_blocking(stdin_fd, False)
        view, offset = memoryview(data), 0
        handed_over = False
        errors: list[bytes] = []
        kept = 0
        with selectors.DefaultSelector() as selector:
            selector.register(stdin_fd, selectors.EVENT_WRITE)
            selector.register(stderr_fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return handed_over, b"".join(errors), True
                if not selector.get_map():
                    # Everything written, stderr closed: wait for the exit.
                    try:
                        proc.wait(timeout=remaining)
                    except subprocess.TimeoutExpired:
                        return handed_over, b"".join(errors), True
                    return handed_over, b"".join(errors), False
                # Wake now and then: a child may exit while a grandchild
                # holds its stderr open.
                events = selector.select(min(remaining, 0.5))
                for key, _mask in events:
                    if key.fd == stdin_fd:
                        try:
                            offset += os.write(stdin_fd, view[offset : offset + 65536])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            # The child stopped reading; its exit status says why.
                            selector.unregister(stdin_fd)
                            proc.stdin.close()
                            continue
                        if offset >= len(view):
                            selector.unregister(stdin_fd)
                            proc.stdin.close()
                            handed_over = True
                    else:
                        chunk = os.read(stderr_fd, 65536)
                        if not chunk:
                            selector.unregister(stderr_fd)
                        elif kept < self.STDERR_LIMIT:
                            errors.append(chunk[: self.STDERR_LIMIT - kept])
                            kept += len(errors[-1])
                if not events and stdin_fd not in selector.get_map() and proc.poll() is not None:
                    return handed_over, b"".join(errors), False
