"""A time zone whose clocks go back at a moment of the test's choosing, for real processes.

``zic`` (Debian's libc-bin) compiles one zone into a folder of its own; a
process finds it there through ``PYTHONTZPATH`` (``zoneinfo``, hence Django
and psycopg) and ``TZDIR`` (the C library: Django sets ``TZ`` to
``TIME_ZONE``). The zone keeps a real name, which Django's settings check
against the system's zoneinfo folder; PostgreSQL's server keeps its own rules
for it, which shows only in the offsets it prints, read back as instants.
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

NAME = "America/New_York"
HOUR = timedelta(hours=1)


def clocks_go_back(folder: Path, at: datetime, name: str = NAME) -> dict[str, str]:
    """Compile ``name``: UTC-4 (EDT) until ``at`` (aware), then UTC-5 (EST).

    Returns the environment that makes a process use it. Every wall-clock time
    of the hour before ``at``, read in EST, happens twice.
    """
    source = folder / "zone.txt"

    def utc(moment: datetime) -> str:
        return moment.astimezone(ZoneInfo("UTC")).strftime("%Y %b %d %H:%M:%S") + "u"

    # EST, EDT from a day before (a zone's first line has no start: zic needs
    # the summer time to begin somewhere), EST again from ``at``.
    source.write_text(
        f"Zone {name} -5:00 - EST {utc(at - timedelta(days=1))}\n"
        f"\t\t\t-5:00 1:00 EDT {utc(at)}\n"
        "\t\t\t-5:00 - EST\n"
    )
    zic = shutil.which("zic", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert zic, "zic (Debian's libc-bin) compiles the test's time zone"
    target = folder / "zoneinfo"
    subprocess.run([zic, "-d", str(target), str(source)], check=True)
    return {
        "OUTBOX_TEST_TIME_ZONE": name,
        "PYTHONTZPATH": str(target),
        "TZDIR": str(target),
    }


def zone_in(env: dict[str, str], name: str = NAME) -> ZoneInfo:
    """The compiled zone, read in this process without changing its search path."""
    with (Path(env["PYTHONTZPATH"]) / name).open("rb") as f:
        return ZoneInfo.from_file(f, key=name)
