"""A private Postfix for tests: SMTP on 127.0.0.1, its log in a file, relaying to a test sink.

:class:`PostfixServer` runs its own instance (``postfix -c DIR``) beside
whatever the host has, and stops it by ``postfix -c DIR stop`` and, if that
fails, by its master's pid. What Postfix 3.7 asks of a private instance:

- its config directory listed in the *default* ``main.cf``'s
  ``alternate_config_directories`` (the file is created if absent and the
  entry taken out again at stop; a lock serialises the edit between test
  processes running at once);
- ``data_directory`` owned by the ``postfix`` user, every parent directory
  traversable by it (so under ``/tmp``, not pytest's private temp folder);
- the log's directory listed in ``maillog_file_prefixes``;
- no chroot (the queue directory would need a copy of ``/etc``).

It needs root and the ``postfix`` binary (``tests/lib.sh``'s
``ensure_tools``); :func:`unavailable` says why it cannot run.

:func:`other_zone` is a Django TIME_ZONE whose offset differs from the host's:
Postfix (and syslog) stamps its log in the host's zone, whatever Django's is.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from outbox.reconcilers.postfix_log import host_zone
from tests.servers import free_port, wait_until

POSTFIX = "/usr/sbin/postfix"
DEFAULT_MAIN_CF = Path("/etc/postfix/main.cf")
LOCK = Path(tempfile.gettempdir()) / "outbox-postfix-main-cf.lock"


def other_zone() -> str:
    """A zone whose offset differs from the host's now (Europe/Berlin unless the host is on it)."""
    now = datetime.now(UTC)
    for name in ("Europe/Berlin", "Asia/Tokyo"):
        if now.astimezone(ZoneInfo(name)).utcoffset() != now.astimezone(host_zone()).utcoffset():
            return name
    raise AssertionError("unreachable: Berlin and Tokyo differ")


def unavailable() -> str | None:
    """Why a private Postfix cannot run here, or None."""
    if not os.access(POSTFIX, os.X_OK):
        return "Postfix is not installed (tests/run.sh installs it with apt-get)"
    if os.geteuid() != 0:
        return "a private Postfix needs root (its daemons switch to the postfix user)"
    try:
        pwd.getpwnam("postfix")
    except KeyError:
        return "there is no postfix user"
    return None


class PostfixServer:
    """Postfix on ``127.0.0.1:port`` relaying everything to ``127.0.0.1:relay_port``."""

    def __init__(self, relay_port: int) -> None:
        self.relay_port = relay_port
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-postfix-", dir="/tmp"))
        self.config = self.dir / "etc"
        self.log = self.dir / "log" / "maillog"
        self.master_pid: int | None = None

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        # Without TZ the daemons write the host's zone, as syslog would;
        # the Django process's TZ comes from settings.TIME_ZONE.
        env = {k: v for k, v in os.environ.items() if k != "TZ"}
        return subprocess.run(
            [POSTFIX, "-c", str(self.config), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def start(self) -> PostfixServer:
        user = pwd.getpwnam("postfix")
        self.dir.chmod(0o755)
        for sub in ("etc", "spool", "data", "log"):
            (self.dir / sub).mkdir(mode=0o755)
        for sub in ("data", "log"):
            os.chown(self.dir / sub, user.pw_uid, user.pw_gid)
        (self.config / "main.cf").write_text(self._main_cf())
        (self.config / "master.cf").write_text(self._master_cf())
        self._list_config(add=True)
        started = self._run("start")
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"postfix start failed: {started.stdout}{started.stderr}")
        pid_file = self.dir / "spool" / "pid" / "master.pid"
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30)
        self.master_pid = int(pid_file.read_text().strip())
        wait_until(self._accepts, timeout=30)
        return self

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.master_pid is not None:
            self._run("stop")
            try:
                wait_until(lambda: not _alive(self.master_pid), timeout=20)
            except AssertionError:
                os.kill(self.master_pid, signal.SIGKILL)
            self.master_pid = None
        self._list_config(add=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _main_cf(self) -> str:
        return f"""\
compatibility_level = 3.6
queue_directory = {self.dir / "spool"}
data_directory = {self.dir / "data"}
mail_owner = postfix
setgid_group = postdrop
syslog_name = postfix-outbox-tests
maillog_file = {self.log}
maillog_file_prefixes = {self.log.parent}
myhostname = outbox-tests.localdomain
mydestination =
local_recipient_maps =
alias_maps =
alias_database =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject
relayhost = [127.0.0.1]:{self.relay_port}
smtp_tls_security_level = none
smtpd_tls_security_level = none
smtp_address_preference = ipv4
biff = no
"""

    def _master_cf(self) -> str:
        """Debian's master.cf, chroot off everywhere, smtpd on our port only."""
        lines = []
        for line in Path("/etc/postfix/master.cf").read_text().splitlines():
            fields = line.split()
            if line[:1] in ("", "#", " ", "\t") or len(fields) < 8:
                lines.append(line)
                continue
            if fields[:2] == ["smtp", "inet"]:
                fields[0] = f"127.0.0.1:{self.port}"
            elif fields[1] == "inet":
                continue  # submission, smtps and the like: not ours to open
            fields[4] = "n"
            lines.append("  ".join(fields))
        return "\n".join(lines) + "\n"

    def _list_config(self, *, add: bool) -> None:
        """Add or remove our config directory in the default main.cf's alternate list."""
        with LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = DEFAULT_MAIN_CF.read_text() if DEFAULT_MAIN_CF.exists() else ""
            key = "alternate_config_directories"
            kept = [line for line in text.splitlines() if not line.startswith(f"{key} =")]
            current = [
                d.strip(" ,")
                for line in text.splitlines()
                if line.startswith(f"{key} =")
                for d in line.split("=", 1)[1].replace(",", " ").split()
            ]
            dirs = [d for d in current if d != str(self.config)]
            if add:
                dirs.append(str(self.config))
            if dirs:
                kept.append(f"{key} = {' '.join(dirs)}")
            if kept:
                DEFAULT_MAIN_CF.write_text("\n".join(kept) + "\n")
            elif DEFAULT_MAIN_CF.exists():
                DEFAULT_MAIN_CF.unlink()  # we created it: the host had none


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
