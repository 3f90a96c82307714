"""anymail's own checks of a message, run without a request: :func:`check_message`.

anymail checks a message while it builds the ESP's payload: a feature the ESP
lacks (``AnymailUnsupportedFeature``), an address it cannot use
(``AnymailInvalidAddress``), a value its JSON cannot hold
(``AnymailSerializationError``, raised when a requests-based payload is
serialised). The drop-in backend runs the same build at ``send()``, so that a
message no configured backend could send is refused there with anymail's own
exception, as anymail alone would raise it, instead of failing its rows in the
worker later.

``build_message_payload(message, defaults)`` is the method every anymail ESP
backend implements and its ``_send`` calls with ``send_defaults``; a requests
payload serialises itself in ``serialize_data()``. Both are anymail's backend
API for ESP implementations (its "Adding support for an ESP" pages), not its
user API: ``tests/compat/test_private_uses.py`` fails loudly if a version changes them, and
anymail's own backend tests run through the outbox (``tests/upstream/test_anymail_backends.py``).
Nothing is sent: ``post_to_esp`` is never called.
"""

from __future__ import annotations

import copy
from typing import Any


def check_message(backend: Any, message: Any) -> None:
    """Raise what ``backend`` (an anymail backend) would raise building ``message``'s request."""
    probe = copy.copy(message)  # the build may note things on the message (its status)
    payload = backend.build_message_payload(probe, backend.send_defaults)
    serialize = getattr(payload, "serialize_data", None)
    if callable(serialize):
        serialize()
