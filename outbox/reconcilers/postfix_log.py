"""Reading Postfix's mail log: one pass over the lines that matter.

Postfix logs each message under a queue id. The lines the reconciler needs::

    Nov 23 12:00:01 mx postfix/pickup[811]: 4Bx0Yz1abcz: uid=33 from=<shop@example.com>
    Nov 23 12:00:01 mx postfix/cleanup[812]: 4Bx0Yz1abcz: message-id=<abc@example.com>
    Nov 23 12:00:01 mx postfix/qmgr[600]: 4Bx0Yz1abcz: from=<shop@example.com>, size=912, nrcpt=1 (queue active)
    Nov 23 12:00:02 mx postfix/smtp[813]: 4Bx0Yz1abcz: to=<a@example.org>, relay=..., dsn=2.0.0, status=sent (250 ok)

with RFC 3339 timestamps (``2026-11-23T12:00:01.123456+00:00 mx postfix/...``)
where syslog is configured so. A ``cleanup`` line names the Message-ID; the
``qmgr`` "queue active" line says the message was committed to Postfix's
queue; a delivery agent (``smtp``, ``lmtp``, ``local``, ``virtual``, ``pipe``)
line gives each recipient's fate. Rotated files (``mail.log.1``,
``mail.log.2.gz``, ``mail.log-20261122``) are read too, oldest first, as far
back as the oldest question needs.

Traditional timestamps carry no zone. Syslog (and Postfix's own
``maillog_file``) writes them in the host's zone, which is not the zone of a
Django process: Django sets ``TZ`` from ``settings.TIME_ZONE``. So they are
read in the zone given by the caller, by default the host's
(:func:`host_zone`), never the process's.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import IO
from zoneinfo import ZoneInfo

# "<timestamp> <host> postfix[-instance]/[service/]agent[pid]: QUEUEID: rest"
_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\S+|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s+(?P<host>\S+)\s+"
    r"postfix[\w.-]*/(?:[\w.-]+/)*(?P<agent>[\w.-]+)\[\d+\]:\s+"
    r"(?:(?P<qid>[0-9A-Za-z]+):\s+)?(?P<rest>.*)$"
)
_MESSAGE_ID = re.compile(r"^message-id=(?P<mid><[^>\s]*>)")
_TO = re.compile(r"^to=<(?P<to>[^>]*)>(?:, orig_to=<(?P<orig>[^>]*)>)?")
_STATUS = re.compile(r"\bstatus=(?P<status>\w+)(?: (?P<text>.*))?$")
_ROTATED = re.compile(r"^\.(?P<n>\d+)(?:\.gz)?$|^-(?P<date>\d{8})(?:\.gz)?$")
DELIVERY_AGENTS = frozenset({"smtp", "lmtp", "local", "virtual", "pipe", "error", "discard"})


@dataclass(frozen=True)
class RecipientStatus:
    recipient: str  # lowercased
    original: str  # orig_to, lowercased, or ""
    status: str  # sent, bounced, deferred, expired, ...
    agent: str
    text: str
    at: datetime


@dataclass
class LogScan:
    """What one pass over the log found about the asked Message-IDs."""

    first: datetime | None = None  # earliest Postfix line read
    last: datetime | None = None  # latest Postfix line read
    files: list[str] = field(default_factory=list)
    queue_ids: dict[str, list[str]] = field(default_factory=dict)  # Message-ID -> queue ids
    committed: dict[str, datetime] = field(default_factory=dict)  # queue id -> "queue active"
    statuses: dict[str, list[RecipientStatus]] = field(default_factory=dict)  # by queue id
    # The syslog host fields of the Postfix lines read: whose log this is.
    hosts: set[str] = field(default_factory=set)

    def note_time(self, at: datetime) -> None:
        if self.first is None or at < self.first:
            self.first = at
        if self.last is None or at > self.last:
            self.last = at

    def accepted(self, message_id: str) -> bool:
        """Whether Postfix committed the message to its queue or delivered it."""
        return any(
            qid in self.committed or qid in self.statuses
            for qid in self.queue_ids.get(message_id, [])
        )


def host_zone(localtime: Path = Path("/etc/localtime")) -> tzinfo:
    """The host's zone, as syslog uses it (``/etc/localtime``); UTC without one.

    Not ``datetime.astimezone()``: that is the process's zone, which Django
    sets from ``settings.TIME_ZONE``.
    """
    try:
        with localtime.open("rb") as handle:
            return ZoneInfo.from_file(handle, key=str(localtime))
    except (OSError, ValueError):
        return UTC


def parse_timestamp(text: str, now: datetime, zone: tzinfo | None = None) -> datetime | None:
    """An aware datetime for a syslog timestamp; ``now`` (aware) supplies the year.

    Traditional timestamps carry no year and no zone: they are read in
    ``zone`` (default: :func:`host_zone`), in the latest year that does not
    put them more than a day in the future (a log read in January holds
    December's lines).
    """
    zone = zone or host_zone()
    try:
        if text[0].isdigit():
            parsed = datetime.fromisoformat(text)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=zone)
        naive = datetime.strptime(f"{now.year} {text}", "%Y %b %d %H:%M:%S")
    except ValueError:
        return None
    local = naive.replace(tzinfo=zone)
    if local > now + timedelta(days=1):
        local = local.replace(year=now.year - 1)
    return local


def log_files(path: Path) -> list[Path]:
    """The log and its rotated copies, newest first."""
    numbered: list[tuple[int, Path]] = []
    dated: list[tuple[str, Path]] = []
    for candidate in path.parent.glob(path.name + "*"):
        match = _ROTATED.match(candidate.name[len(path.name) :])
        if match and match["n"] is not None:
            numbered.append((int(match["n"]), candidate))
        elif match:
            dated.append((match["date"], candidate))
    newest_first = [p for _n, p in sorted(numbered)]
    newest_first += [p for _d, p in sorted(dated, reverse=True)]
    return ([path] if path.exists() else []) + newest_first


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


def _first_time(path: Path, now: datetime, zone: tzinfo) -> datetime | None:
    """The timestamp of the file's first Postfix line (cheap: stops there)."""
    with _open(path) as handle:
        for line in handle:
            match = _LINE.match(line)
            if match:
                return parse_timestamp(match["ts"], now, zone)
    return None


def files_to_read(
    path: Path, since: datetime, now: datetime, zone: tzinfo | None = None
) -> list[Path]:
    """The files, oldest first, that reach back to ``since`` (or all there are)."""
    zone = zone or host_zone()
    chosen: list[Path] = []
    for candidate in log_files(path):
        chosen.append(candidate)
        first = _first_time(candidate, now, zone)
        if first is not None and first <= since:
            break
    return list(reversed(chosen))


def _lines(files: Iterable[Path]) -> Iterator[str]:
    for path in files:
        with _open(path) as handle:
            yield from handle


def scan(
    path: Path, message_ids: set[str], since: datetime, now: datetime, zone: tzinfo | None = None
) -> LogScan:
    """One pass over the log files for all ``message_ids`` at once.

    Files are read oldest first, so a queue id's ``cleanup`` line comes before
    its delivery lines and only the queue ids of asked messages are kept.
    Zone-less timestamps are read in ``zone`` (default: the host's).
    """
    result = LogScan()
    zone = zone or host_zone()
    files = files_to_read(path, since, now, zone)
    result.files = [str(f) for f in files]
    wanted: dict[str, str] = {}  # queue id -> Message-ID
    for line in _lines(files):
        if "postfix" not in line:
            continue
        match = _LINE.match(line.rstrip("\n"))
        if not match:
            continue
        at = parse_timestamp(match["ts"], now, zone)
        if at is None:
            continue
        result.note_time(at)
        result.hosts.add(match["host"])
        qid, rest = match["qid"], match["rest"]
        if not qid:
            continue
        if match["agent"] == "cleanup":
            found = _MESSAGE_ID.match(rest)
            if found and found["mid"] in message_ids:
                wanted[qid] = found["mid"]
                result.queue_ids.setdefault(found["mid"], []).append(qid)
        elif qid not in wanted:
            continue
        elif match["agent"] == "qmgr" and "(queue active)" in rest:
            result.committed.setdefault(qid, at)
        elif match["agent"] in DELIVERY_AGENTS:
            _note_status(result, qid, match["agent"], rest, at)
    return result


def _note_status(result: LogScan, qid: str, agent: str, rest: str, at: datetime) -> None:
    to, status = _TO.match(rest), _STATUS.search(rest)
    if not to or not status:
        return
    result.statuses.setdefault(qid, []).append(
        RecipientStatus(
            recipient=to["to"].lower(),
            original=(to["orig"] or "").lower(),
            status=status["status"],
            agent=agent,
            text=(status["text"] or "").strip(),
            at=at,
        )
    )
