"""Django settings of the chaos run: the test suite's settings, with a short SEND_TIMEOUT.

The chaos run's stalling SMTP server never answers some messages; the workers
must give up on them within ``OUTBOX["SEND_TIMEOUT"]``, which is set here from
OUTBOX_CHAOS_SEND_TIMEOUT (seconds, default 3) so that a stall costs a thread a
few seconds, not the default minute.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import OUTBOX

OUTBOX["SEND_TIMEOUT"] = float(os.environ.get("OUTBOX_CHAOS_SEND_TIMEOUT", "3"))
