"""The cells of the outbox's admin lists: status badges, cut text, compact times.

Each returns escaped HTML (``format_html``) that never wraps: a list row stays
one line high, and whatever a cell leaves out is in its tooltip.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from .models import Delivery

Status = Delivery.Status

# Badge colours: white text on each reads at a glance, and the label is
# always there for anyone who cannot tell the colours apart.
_STATUS_COLORS: dict[str, str] = {
    Status.QUEUED: "#417690",
    Status.PROCESSING: "#8a6d00",
    Status.SENT: "#2e7d32",
    Status.FAILED: "#c62828",
    Status.ABANDONED: "#d84315",
    Status.CANCELLED: "#616161",
}


def status_badge(status: str) -> SafeString:
    """A coloured label for a delivery status."""
    label = Status(status).label if status in Status.values else status
    return format_html(
        '<span class="outbox-status outbox-status-{}" style="display:inline-block;'
        "padding:1px 8px;border-radius:9px;color:#fff;background:{};font-weight:bold;"
        'white-space:nowrap">{}</span>',
        status,
        _STATUS_COLORS.get(status, "#616161"),
        label,
    )


# List cells: longer text is cut, with the whole of it in the tooltip. The
# widths (in em of the list's font) are a safety net for wide letters: with
# them the delivery list fits a 1,400 px window beside its filters.
SUBJECT_CHARS = 45
SUBJECT_WIDTH = 24
RECIPIENT_CHARS = 32
RECIPIENT_WIDTH = 17
# A tooltip shows at most this much of a (rare) very long subject.
TOOLTIP_CHARS = 1000


def truncated(text: str, chars: int, width: int) -> SafeString:
    """``text`` cut to ``chars`` characters (and ``width`` em), whole in its ``title``."""
    one_line = " ".join(text.split())
    return format_html(
        '<span class="outbox-cut" title="{}" style="display:inline-block;max-width:{}em;'
        'overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom">'
        "{}</span>",
        Truncator(one_line).chars(TOOLTIP_CHARS),
        width,
        Truncator(one_line).chars(chars),
    )


def compact_time(value: datetime | None, now: datetime | None = None) -> SafeString | None:
    """A compact time: "Nov 23 14:05" this year, "Nov 23, 2025" before; in the current time zone.

    The full timestamp, with seconds and the zone, is in the tooltip. None for
    no time, which the admin shows as its empty value.
    """
    if value is None:
        return None
    local = timezone.localtime(value)
    this_year = timezone.localtime(now or timezone.now()).year
    short = dateformat.format(local, "M j H:i" if local.year == this_year else "M j, Y")
    return format_html(
        '<time datetime="{}" title="{}" style="white-space:nowrap">{}</time>',
        value.isoformat(),
        dateformat.format(local, "Y-m-d H:i:s T"),
        short,
    )
