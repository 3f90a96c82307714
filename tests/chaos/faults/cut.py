"""Fault: the SMTP server records the message, then cuts the connection before replying.

Like stall.py (whose ``play_smtp_fault`` this uses), for a seeded queued row
never tried yet: once DATA's final dot arrives the server writes the message
to its receipts and aborts the connection with no reply. The server has the
message, the worker cannot know: under "review" the row ends ``abandoned``
with an "ambiguous" Attempt and exactly one receipt; under "requeue" it is
retried and arrives again (at least once). analysis.py (``check_ambiguous``)
checks the rows at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.chaos.faults.stall import play_smtp_fault

if TYPE_CHECKING:
    from tests.chaos.child import Child


def cut_after_data(child: Child) -> None:
    play_smtp_fault(child, "cut", record=True)
