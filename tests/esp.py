"""A fake email service provider: a real HTTP server on loopback speaking two ESPs' send APIs.

anymail's Postmark and Mailgun backends are pointed at it by their API URL
settings (``ANYMAIL["POSTMARK_API_URL"]``, ``ANYMAIL["MAILGUN_API_URL"]``:
:func:`anymail_settings`), so the worker's real requests go through real
sockets. What it answers is decided per request by :attr:`FakeESP.plan`
(``recipient -> list of actions``, taken in order; ``"ok"`` once it runs out)
or, when set, by :attr:`FakeESP.choose` (the chaos run's dice):

``ok``       accepted: 200 and the ESP's success JSON with its own message id
``slow``     accepted, then the answer comes after the client's timeout
``reset``    accepted, then the connection is reset instead of an answer
``drop``     the request is read, not accepted, and the connection is reset
``429``      refused for now, with ``Retry-After`` (:attr:`FakeESP.retry_after`)
``422``      Postmark's refusal of the recipient (``ErrorCode`` 300); Mailgun's 400
``unsigned`` Postmark's refusal of the account's sending: 422, ``ErrorCode`` 400 (no
             sender signature for the From address)
``500``, ``502``, ``503``  that status (503 with ``Retry-After``)
``gateway``  accepted, then a gateway's 502 instead of the ESP's answer
``early500`` Postmark: accepted, its Delivery webhook posted to
             :attr:`FakeESP.webhook_url` (and answered) first, then a 500
``earlyslow`` the same, then the answer comes after the client's timeout
``earlyok``  the same, then the usual success answer
``inactive`` Postmark: the request is accepted, but not for this recipient
             (Postmark's "inactive addresses" answer); anymail says ``rejected``

A request's action is its first recipient's; a Postmark request may name
several (To, Cc and Bcc: one message), each kept as its own :class:`Accepted`
with the one ESP id, and every request body is kept in :attr:`FakeESP.bodies`.

Before any of these, the credential: with :attr:`FakeESP.server_token` (Postmark's
``X-Postmark-Server-Token``) or :attr:`FakeESP.api_key` (Mailgun's basic-auth
password) set, a request carrying another is answered 401, as each ESP answers
it (Postmark's ``ErrorCode`` 10), and recorded as the action ``"401"``.

Every accepted message is kept (:attr:`FakeESP.accepted`) with the ESP's id,
its recipient, its metadata and its Message-ID; :func:`postmark_event` and
:func:`mailgun_event` write the webhook body that ESP would post about it.
"""

from __future__ import annotations

import base64
import email
import hashlib
import hmac
import json
import random
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import getaddresses, parseaddr
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

POSTMARK_BACKEND = "anymail.backends.postmark.EmailBackend"
MAILGUN_BACKEND = "anymail.backends.mailgun.EmailBackend"
WEBHOOK_SECRET = "tests:only-webhook-secret"  # tests/settings.py's ANYMAIL["WEBHOOK_SECRET"]
MAILGUN_SIGNING_KEY = "tests-only-mailgun-signing-key"


@dataclass
class Accepted:
    """One message the fake ESP took."""

    esp: str  # "Postmark" or "Mailgun"
    esp_id: str  # the ESP's own message id
    to: str
    metadata: dict[str, str]
    message_id: str  # the RFC Message-ID header, as sent
    at: float = field(default_factory=time.time)
    payload: dict[str, Any] = field(default_factory=dict)  # the request's JSON or form, whole
    token: str = ""  # Postmark's X-Postmark-Server-Token header


class FakeESP:
    """The server; :meth:`start` it, :meth:`stop` it (its threads end with it)."""

    def __init__(self, *, answer_after: float = 2.0, retry_after: str = "1") -> None:
        self.plan: dict[str, list[str]] = {}
        self.choose: Callable[[str], str] | None = None
        self.answer_after = answer_after  # "slow": longer than the client's timeout
        self.retry_after = retry_after
        self._defaults = (retry_after, answer_after)
        self.accepted: list[Accepted] = []
        self.requests: list[tuple[str, str]] = []  # (recipient, action)
        self.bodies: list[dict[str, Any]] = []  # every request's body, parsed (Postmark)
        # Where the "early" actions post their webhooks (a real server's anymail
        # view), and the HTTP status of each post.
        self.webhook_url = ""
        self.early_hook: Callable[[Accepted], int] | None = None
        self.webhook_statuses: list[int] = []
        # The credentials it takes (None: any); a request with another gets a 401.
        self.server_token: str | None = None
        self.api_key: str | None = None
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reset(self) -> None:
        """Forget every plan, request and credential: a test's fresh start on a module's server."""
        with self.lock:
            self.plan.clear()
            self.choose = None
            self.retry_after, self.answer_after = self._defaults
            self.server_token = self.api_key = None
            self.accepted.clear()
            self.requests.clear()
            self.bodies.clear()
            self.webhook_statuses.clear()

    def start(self) -> FakeESP:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def action(self, recipient: str) -> str:
        recipient = parseaddr(recipient)[1].lower()
        with self.lock:
            if self.choose is not None:
                chosen = self.choose(recipient)
            else:
                queued = self.plan.get(recipient, [])
                chosen = queued.pop(0) if queued else "ok"
            self.requests.append((recipient, chosen))
            return chosen

    def refuse(self, recipient: str) -> None:
        """Record a request refused for its credential (the action ``"401"``)."""
        with self.lock:
            self.requests.append((parseaddr(recipient)[1].lower(), "401"))

    def accept(
        self,
        esp: str,
        to: str,
        metadata: dict[str, str],
        message_id: str,
        payload: dict[str, Any] | None = None,
        token: str = "",
        *,
        esp_id: str = "",
    ) -> Accepted:
        if not esp_id:
            esp_id = (
                str(uuid.uuid4()) if esp == "Postmark" else f"<{uuid.uuid4().hex}@mg.example.com>"
            )
        to = parseaddr(to)[1]
        taken = Accepted(esp, esp_id, to, metadata, message_id, payload=payload or {}, token=token)
        with self.lock:
            self.accepted.append(taken)
        return taken

    def post_event(self, taken: Accepted) -> None:
        """Post Postmark's Delivery webhook about ``taken`` to :attr:`webhook_url`, and wait.

        Without a URL, :attr:`early_hook` posts it (the chaos run's, through
        Django's test client in this process).
        """
        if not self.webhook_url and self.early_hook is not None:
            status = self.early_hook(taken)
            with self.lock:
                self.webhook_statuses.append(status)
            return
        request = urllib.request.Request(
            self.webhook_url,
            data=json.dumps(postmark_event(taken)).encode(),
            headers={"Content-Type": "application/json", "Authorization": basic_auth()},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        with self.lock:
            self.webhook_statuses.append(status)

    def inactive(self, recipient: str) -> bool:
        """Whether ``recipient``'s next planned action is ``inactive`` (then taken)."""
        recipient = parseaddr(recipient)[1].lower()
        with self.lock:
            queued = self.plan.get(recipient, [])
            if queued and queued[0] == "inactive":
                queued.pop(0)
                self.requests.append((recipient, "inactive"))
                return True
            return False

    def accepted_for(self, recipient: str) -> list[Accepted]:
        with self.lock:
            return [a for a in self.accepted if a.to.lower() == recipient.lower()]


def _handler(esp: FakeESP) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the real APIs

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            # Postmark's /email, and /email/withTemplate/ for a message with a template_id.
            if self.path.rstrip("/").endswith(("/email", "/email/withTemplate")):
                self.postmark(json.loads(body))
            elif self.path.endswith("/messages"):
                self.mailgun(_form(self.headers.get("Content-Type", ""), body))
            else:
                self.answer(404, {"message": "not found"})

        def postmark(self, data: dict[str, Any]) -> None:
            with esp.lock:
                esp.bodies.append(data)
            to = data.get("To", "")
            recipients = [
                address
                for name in ("To", "Cc", "Bcc")
                for _name, address in getaddresses([data.get(name) or ""])
                if address
            ]
            token = esp.server_token
            if token is not None and self.headers.get("X-Postmark-Server-Token") != token:
                esp.refuse(recipients[0] if recipients else to)
                message = "Request does not contain a valid Server token."
                return self.answer(401, {"ErrorCode": 10, "Message": message})
            headers = {h["Name"].lower(): h["Value"] for h in data.get("Headers", [])}
            first = recipients[0] if recipients else ""
            first_inactive = esp.inactive(first)
            action = "ok" if first_inactive else esp.action(first)
            if action == "422":
                message = f"Invalid 'To' address: '{parseaddr(to)[1]}'."
                return self.answer(422, {"ErrorCode": 300, "Message": message})
            if action == "unsigned":
                message = (
                    f"The 'From' address you supplied ({data.get('From', '')}) is not a "
                    "Sender Signature on your account."
                )
                return self.answer(422, {"ErrorCode": 400, "Message": message})
            if self.failed(action, {"ErrorCode": 701, "Message": "fake failure"}):
                return
            refused = [r.lower() for r in recipients[1:] if esp.inactive(r)]
            if first_inactive:
                refused.insert(0, first.lower())
            token = self.headers.get("X-Postmark-Server-Token", "")
            esp_id = str(uuid.uuid4())
            taken = [
                esp.accept(
                    "Postmark",
                    recipient,
                    data.get("Metadata", {}),
                    headers.get("message-id", ""),
                    data,
                    token,
                    esp_id=esp_id,
                )
                for recipient in recipients
                if recipient.lower() not in refused
            ]
            if action.startswith("early"):
                for copy in taken:  # the ESP's word before its answer
                    esp.post_event(copy)
                if action == "early500":
                    return self.answer(500, {"ErrorCode": 701, "Message": "fake failure"})
                action = "slow" if action == "earlyslow" else "ok"
            message = "OK"
            if refused:
                message = (
                    "Message OK, but will not deliver to these inactive addresses: "
                    f"{', '.join(refused)}. Inactive recipients are ones that have generated "
                    "a hard bounce or a spam complaint."
                )
            answer = {
                "SubmittedAt": "2026-01-01T00:00:00Z",
                "MessageID": esp_id,
                "ErrorCode": 0,
                "Message": message,
            }
            if to:  # as Postmark: no "To" in the answer to a Cc- or Bcc-only message
                answer["To"] = to
            self.accepted(action, answer)

        def mailgun(self, form: dict[str, str]) -> None:
            to = form.get("to", "")
            if esp.api_key is not None and self.headers.get("Authorization") != _basic(
                f"api:{esp.api_key}"
            ):
                esp.refuse(to)
                return self.answer(401, {"message": "Invalid private key"})
            action = esp.action(to)
            if action == "422":
                return self.answer(400, {"message": "'to' parameter is not a valid address."})
            if self.failed(action, {"message": "fake failure"}):
                return
            metadata = {k[2:]: v for k, v in form.items() if k.startswith("v:")}
            message_id = form.get("h:Message-Id", "") or form.get("h:Message-ID", "")
            taken = esp.accept("Mailgun", to, metadata, message_id, form)
            self.accepted(action, {"id": taken.esp_id, "message": "Queued. Thank you."})

        def failed(self, action: str, body: dict[str, Any]) -> bool:
            """Answer a refusal or reset before acceptance; False when the ESP takes it."""
            if action == "drop":
                self.reset()
            elif action in ("429", "503"):
                self.answer(int(action), body, {"Retry-After": esp.retry_after})
            elif action in ("500", "502"):
                self.answer(int(action), body)
            else:
                return False
            return True

        def accepted(self, action: str, body: dict[str, Any]) -> None:
            if action == "reset":
                return self.reset()
            if action == "gateway":
                return self.answer(502, {"message": "bad gateway"})
            if action == "slow":
                time.sleep(esp.answer_after)
            try:
                self.answer(200, body)
            except OSError:
                pass  # the client gave up waiting: its answer is lost

        def answer(
            self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
        ) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)
            self.wfile.flush()

        def reset(self) -> None:
            """Close with RST (SO_LINGER 0): the client reads a reset, not an answer."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

    return Handler


def _form(content_type: str, body: bytes) -> dict[str, str]:
    """A form body, urlencoded or multipart (Mailgun's send API takes either)."""
    if content_type.startswith("multipart/"):
        parsed = email.message_from_bytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
        form: dict[str, str] = {}
        for part in parsed.walk():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if name and str(name) not in form and isinstance(payload, bytes):
                form[str(name)] = payload.decode("utf-8", "replace")
        return form
    return {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}


def anymail_settings(url: str, timeout: float) -> dict[str, Any]:
    """The ANYMAIL setting that points both backends at ``url``."""
    return {
        "POSTMARK_SERVER_TOKEN": "tests-only-server-token",
        "POSTMARK_API_URL": url,
        "MAILGUN_API_KEY": "tests-only-api-key",
        "MAILGUN_API_URL": f"{url}v3",
        "MAILGUN_WEBHOOK_SIGNING_KEY": MAILGUN_SIGNING_KEY,
        "WEBHOOK_SECRET": WEBHOOK_SECRET,
        "REQUESTS_TIMEOUT": timeout,
    }


# A worker is declared dead (and its lease runs out) sooner than with the suite's 3 s.
HEARTBEATS = {"OUTBOX_TEST_HEARTBEAT_TIMEOUT": "1.5", "OUTBOX_TEST_HEARTBEAT_INTERVAL": "0.25"}


def worker_env(
    esp: FakeESP, timeout: float, backend: str = POSTMARK_BACKEND, **extra: str
) -> dict[str, str]:
    """A worker's or sweeper's environment: ``backend`` pointed at ``esp`` (tests/settings.py)."""
    return {
        "OUTBOX_TEST_EMAIL_BACKEND": backend,
        "OUTBOX_TEST_ESP_URL": esp.url,
        "OUTBOX_TEST_ESP_TIMEOUT": str(timeout),
        **extra,
    }


# -- webhook bodies, in each ESP's own JSON -------------------------------------------


def postmark_event(taken: Accepted, record_type: str = "Delivery") -> dict[str, Any]:
    """Postmark's webhook about ``taken``: Delivery, Bounce, Open, Click or SpamComplaint."""
    event: dict[str, Any] = {
        "RecordType": record_type,
        "ServerID": 23,
        "MessageStream": "outbound",
        "MessageID": taken.esp_id,
        "Recipient": taken.to,
        "Tag": "",
        "Metadata": taken.metadata,
    }
    if record_type == "Delivery":
        event |= {"DeliveredAt": "2026-01-01T00:00:01Z", "Details": "Test delivery"}
    elif record_type == "Bounce":
        event |= {
            "ID": random.randrange(1, 10**9), "Type": "HardBounce", "TypeCode": 1,
            "Email": taken.to, "BouncedAt": "2026-01-01T00:00:01Z",
            "Details": "smtp;550 5.1.1 no such user", "Description": "hard bounce",
        }  # fmt: skip
    elif record_type == "Open":
        event |= {"ReceivedAt": "2026-01-01T00:00:02Z", "FirstOpen": True}
    return event


def mailgun_event(taken: Accepted, event: str = "delivered", **extra: Any) -> dict[str, Any]:
    """Mailgun's webhook about ``taken``, signed as Mailgun signs it."""
    timestamp, token = str(int(time.time())), uuid.uuid4().hex
    signature = hmac.new(
        MAILGUN_SIGNING_KEY.encode(), f"{timestamp}{token}".encode(), hashlib.sha256
    ).hexdigest()
    data = {
        "event": event,
        "timestamp": time.time(),
        "id": uuid.uuid4().hex,
        "recipient": taken.to,
        "user-variables": taken.metadata,
        "message": {"headers": {"message-id": taken.esp_id.strip("<>"), "to": taken.to}},
        **extra,
    }
    return {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature},
        "event-data": data,
    }


def basic_auth() -> str:
    return _basic(WEBHOOK_SECRET)


def _basic(user_and_password: str) -> str:
    return "Basic " + base64.b64encode(user_and_password.encode()).decode()


__all__ = [
    "MAILGUN_BACKEND",
    "POSTMARK_BACKEND",
    "Accepted",
    "FakeESP",
    "anymail_settings",
    "basic_auth",
    "mailgun_event",
    "postmark_event",
]
