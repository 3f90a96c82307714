"""The cells of the outbox's admin lists: status badges, cut text, compact times.

Each returns escaped HTML (``format_html``) that never wraps: whatever a cell
leaves out is in its tooltip.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext

from ..models import Delivery

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


# List cells: longer text is cut, with the whole of it in the tooltip. In the
# delivery list the subject sits under the recipient and the column's width cuts
# both (with an ellipsis); these caps bound what a row sends at any width.
SUBJECT_CHARS = 80
RECIPIENT_CHARS = 64
# A tooltip shows at most this much of a (rare) very long subject.
TOOLTIP_CHARS = 1000


def truncated(text: str, chars: int, width: int | None = None, kind: str = "") -> SafeString:
    """``text`` cut to ``chars`` characters, whole in its ``title``.

    With ``width`` (in em) it is at most that wide; without, it is a line of its
    own, as wide as its cell. ``kind`` adds the class ``outbox-<kind>``.
    """
    one_line = " ".join(text.split())
    size = f"display:inline-block;max-width:{width}em" if width else "display:block"
    return format_html(
        '<span class="outbox-cut{}" title="{}" style="{};'
        'overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom">'
        "{}</span>",
        f" outbox-{kind}" if kind else "",
        Truncator(one_line).chars(TOOLTIP_CHARS),
        size,
        Truncator(one_line).chars(chars),
    )


def recipient_and_subject(recipient: str, subject: str) -> SafeString:
    """The delivery list's first cell: the recipient, and the subject on a line under it."""
    return format_html(
        "{}{}",
        truncated(recipient, RECIPIENT_CHARS, kind="recipient"),
        truncated(subject, SUBJECT_CHARS, kind="subject"),
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


def age(seconds: float | None) -> str:
    """A short duration: "0.4 s", "42 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"."""
    if seconds is None:
        return ""
    if seconds < 10:
        return gettext("%(n).1f s") % {"n": seconds}
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return gettext("%(d)d d %(h)d h") % {"d": days, "h": hours}
    if hours:
        return gettext("%(h)d h %(m)d min") % {"h": hours, "m": minutes}
    if minutes:
        return gettext("%(m)d min %(s)d s") % {"m": minutes, "s": secs}
    return gettext("%(s)d s") % {"s": secs}
