"""Redis Sentinel and Redis Cluster on loopback, for the failover tests.

- :class:`SentinelSetup`: a primary, a replica and three sentinels
  (``redis-server --sentinel``), with a short ``down-after-milliseconds``.
- :class:`ClusterSetup`: six nodes joined by ``redis-cli --cluster create
  --cluster-replicas 1``: three primaries, a replica each, a short
  ``cluster-node-timeout``.

Every process binds 127.0.0.1 on a free port, is started here and stopped
here by its pid (``Popen``). ``cache()`` is the django-redis cache that
carries the outbox on the topology; ``env()`` says the same to a worker or
sweeper subprocess (``tests/settings.py`` reads ``OUTBOX_TEST_REDIS_TOPOLOGY``).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import redis

from tests.servers import free_port, wait_until

SERVICE = "outbox-primary"
# The test settings' client timeouts: short, so a dead node is noticed quickly.
CLIENT_OPTIONS: dict[str, Any] = {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2}


def cache_from_env(value: str) -> dict[str, Any]:
    """The cache for ``OUTBOX_TEST_REDIS_TOPOLOGY``: ``cluster:h:p,h:p`` or ``sentinel:h:p,h:p``."""
    kind, _, nodes = value.partition(":")
    addresses = nodes.split(",")
    if kind == "cluster":
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": [f"redis://{a}" for a in addresses],
            "OPTIONS": {"CLIENT_CLASS": "outbox.redis_cluster.ClusterClient", **CLIENT_OPTIONS},
        }
    if kind == "sentinel":
        sentinels = [(a.rpartition(":")[0], int(a.rpartition(":")[2])) for a in addresses]
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": sentinels,
                **CLIENT_OPTIONS,
            },
        }
    raise ValueError(f"unknown topology {value!r}")


def _bus_free_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class _Node:
    def __init__(self, root: Path, port: int, *args: str) -> None:
        self.port = port
        self.dir = root / str(port)
        self.dir.mkdir()
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> _Node:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (tests/lib.sh ensure_tools installs it)"
        self.log = (self.dir / "log").open("wb")
        self.process = subprocess.Popen(
            [exe, *self.args], cwd=self.dir, stdout=self.log, stderr=subprocess.STDOUT
        )
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=1
        )

    def alive(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a lost host or the OOM killer would."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        self.process = None
        self.log.close()


def _server_args(port: int) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


class _Topology(ABC):
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="outbox-topology-"))
        self.nodes: list[_Node] = []

    def cache(self) -> dict[str, Any]:
        return cache_from_env(self.topology())

    def env(self) -> dict[str, str]:
        return {"OUTBOX_TEST_REDIS_TOPOLOGY": self.topology()}

    @abstractmethod
    def topology(self) -> str:
        """The topology's description for tests/settings.py (OUTBOX_TEST_REDIS_TOPOLOGY)."""

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class SentinelSetup(_Topology):
    """A primary, its replica, three sentinels; failover within a few seconds."""

    def start(self) -> SentinelSetup:
        primary_port, replica_port = free_port(), free_port()
        self.primary = _Node(self.root, primary_port, *_server_args(primary_port)).start()
        self.replica = _Node(
            self.root,
            replica_port,
            *_server_args(replica_port),
            "--replicaof",
            "127.0.0.1",
            str(primary_port),
        ).start()
        self.nodes = [self.primary, self.replica]
        self.sentinels: list[_Node] = []
        for _ in range(3):
            port = free_port()
            node = _Node(self.root, port)
            (node.dir / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndir {node.dir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            node.args = (str(node.dir / "sentinel.conf"), "--sentinel")
            self.sentinels.append(node.start())
        self.nodes += self.sentinels
        wait_until(lambda: all(n.alive() for n in self.nodes), timeout=20)
        wait_until(self._ready, timeout=30, interval=0.2)
        return self

    def _ready(self) -> bool:
        try:
            if self.replica.client().info("replication").get("master_link_status") != "up":
                return False
            for sentinel in self.sentinels:
                client = sentinel.client()
                if not client.execute_command("SENTINEL", "REPLICAS", SERVICE):
                    return False
                if len(client.execute_command("SENTINEL", "SENTINELS", SERVICE)) < 2:
                    return False
        except redis.RedisError:
            return False
        return True

    def current_primary_port(self) -> int | None:
        """The primary's port as the sentinels see it (None while they disagree)."""
        seen = set()
        for sentinel in self.sentinels:
            try:
                _host, port = sentinel.client().execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
                )
            except (redis.RedisError, TypeError, ValueError):
                return None
            seen.add(int(port))
        return seen.pop() if len(seen) == 1 else None

    def topology(self) -> str:
        return "sentinel:" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)


class ClusterSetup(_Topology):
    """Three primaries and a replica each, created with ``redis-cli --cluster create``."""

    def start(self) -> ClusterSetup:
        for _ in range(6):
            port = _bus_free_port()
            node = _Node(
                self.root,
                port,
                *_server_args(port),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                # Any replica may take over, however long it has been connected.
                "--cluster-replica-validity-factor",
                "0",
            )
            self.nodes.append(node.start())
        wait_until(lambda: all(n.alive() for n in self.nodes), timeout=20)
        cli = shutil.which("redis-cli")
        assert cli, "redis-cli is not installed (it comes with redis-server)"
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_until(self._ready, timeout=30, interval=0.2)
        return self

    def _ready(self) -> bool:
        try:
            for node in self.nodes:
                info = node.client().execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or "cluster_known_nodes:6" not in text:
                    return False
                replication = node.client().info("replication")
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
        except redis.RedisError:
            return False
        return True

    def node_holding(self, key: str) -> _Node:
        """The live primary that serves ``key``'s slot, as a live node tells."""
        for node in self.nodes:
            if not node.alive():
                continue
            slot = int(node.client().execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, primary, *_replicas in node.client().execute_command(
                "CLUSTER", "SLOTS"
            ):
                if int(start) <= slot <= int(end):
                    port = int(primary[1])
                    return next(n for n in self.nodes if n.port == port)
        raise AssertionError("no live node answers CLUSTER SLOTS")

    def topology(self) -> str:
        return "cluster:" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
