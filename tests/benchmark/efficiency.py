"""The benchmark's efficiency part (PostgreSQL, issue 27): CPU per delivered email and latency.

- **CPU per delivered email**, ours (the README's ``--processes 2 --concurrency 16``)
  against post_office's ``send_queued_mail`` with 1 and with 2 processes, with the
  no-op backend, with the 20 ms SMTP sink and, where a private Postfix can run
  (``tests/postfix.py``: root and the ``postfix`` binary), through Postfix
  relaying to the sink. Each run is measured from spawning the command to its exit
  (through Postfix: until the sink has every message), and the same command is run
  once more on an empty queue: the difference divided by the emails is the
  steady-state cost of one email, without the one-off Python and Django start-up.
  Counted per run:

  - machine: busy jiffies of ``/proc/stat`` (everything on the machine, so also
    whatever else runs on it: read it with the load average next to it);
  - workers: the delivery command and its children (``RUSAGE_CHILDREN`` of this
    process around the run: the command is the only child that ends in it);
  - PostgreSQL: the postmaster's tree from ``/proc/<pid>/stat`` (utime, stime and
    the reaped children's cutime and cstime, so backends that ended count too);
  - redis-server: its ``/proc/<pid>/stat``; the SMTP sink and Postfix likewise;
  - commits: PostgreSQL's ``xact_commit`` for the database (``pg_stat_database``),
    read once the command's sessions have ended (a session's counts are flushed
    when it ends).

  Cores = tier CPU per email x the steady rate: how much of the machine the tier
  kept busy, which tells a run that waits apart from one that computes.

  The target is judged on workers + PostgreSQL + redis-server (the mail tier's own
  CPU, which other tenants of a shared machine cannot inflate); the machine-wide
  figure is printed next to it.
- **Enqueue CPU**: one-recipient ``enqueue_email`` against ``mail.send``, this
  process's CPU plus PostgreSQL's and redis-server's, per call.
- **Latency** from the enqueue's commit (an on-commit hook registered before the
  enqueue's own) to the sink's acceptance (its log, after its 20 ms), at a steady
  offered load of 100/s and at half the capacity measured in the SMTP run, with
  real (not burst) workers, stopped by pid; split at the row's
  ``processing_started_at`` into the wait for a worker and the send.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from typing import Any

from tests.benchmark import floor
from tests.benchmark.common import BODY, SENDER, SUBJECT, rcpt, run_timed
from tests.benchmark.instruments import xact_commit
from tests.benchmark.sending import _Sink, _wait, _Workers

HZ = os.sysconf("SC_CLK_TCK")
OURS = "outbox_worker --processes 2 --concurrency 16"
PO_CONFIGS = {
    "send_queued_mail (1 process)": [],
    "send_queued_mail --processes 2": ["--processes", "2"],
}
LATENCY_SECONDS = 10.0


# -- CPU counters ---------------------------------------------------------------------------


def machine_ticks() -> list[int]:
    """The whole machine's CPU ticks so far, /proc/stat's first line: user, nice, system,
    idle, iowait, irq, softirq, steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine (all but idle and iowait)."""
    v = machine_ticks()
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / HZ


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def pid_cpu(pid: int) -> float:
    """CPU seconds of a process and of its children it has reaped."""
    f = _stat(pid)
    return 0.0 if f is None else sum(int(x) for x in f[11:15]) / HZ


def tree_cpu(root: int) -> float:
    """CPU seconds of a process tree (live descendants, and what each reaped)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = _stat(int(name))
            if f is not None:
                children.setdefault(int(f[1]), []).append(int(name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += pid_cpu(pid)
        todo += children.get(pid, [])
    return total


def pg_commits() -> int:
    """Transactions committed in this database, once every other session has ended."""
    from django.db import connection

    deadline = time.monotonic() + 10
    with connection.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cur.fetchone()[0] == 0:
                break
            time.sleep(0.02)
        # A session leaves pg_stat_activity just before it flushes its counts.
        time.sleep(0.1)
        commits = xact_commit(cur)
    connection.close()
    return commits


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Meter:
    """Snapshots of the counters; ``since`` gives the deltas."""

    def __init__(self, pg_pid: int, redis_pid: int, extra: dict[str, int]) -> None:
        self.pg_pid, self.redis_pid, self.extra = pg_pid, redis_pid, extra

    def snap(self, own: bool = False) -> dict[str, float]:
        out = {
            "machine": machine_busy(),
            "workers": time.process_time() if own else children_cpu(),
            "postgres": tree_cpu(self.pg_pid),
            "redis": pid_cpu(self.redis_pid),
            "wall": time.perf_counter(),
        }
        for name, pid in self.extra.items():
            out[name] = tree_cpu(pid)
        return out

    @staticmethod
    def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before[k] for k in before}


def tier(d: dict[str, float]) -> float:
    """The mail tier's own CPU: workers (or the enqueuing process), PostgreSQL, redis-server."""
    return d["workers"] + d["postgres"] + d["redis"]


def pctl(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class EfficiencyMixin:
    """The efficiency part of the benchmark's ``Child`` (see child.py)."""

    db: str
    extra: dict[str, Any]
    repeat: int
    sizes: Any
    redis: Any

    def bench_efficiency(self) -> None:
        self._meter_base = self._server_pids()
        data: dict[str, Any] = {"load_start": os.getloadavg()[0]}
        data["noop"] = self._cpu_scenario("noop", self.sizes.drain_noop, None, {})
        with _Sink(self.sizes.smtp_delay) as sink:
            data["smtp"] = self._cpu_scenario(
                "smtp", self.sizes.drain_smtp, sink.port, {"sink": sink.proc.pid}
            )
            data["postfix"] = self._postfix(sink)
        data["enqueue"] = self._enqueue_cpu(self.sizes.enqueue_single)
        capacity = data["smtp"]["outbox"]["steady_rate"]
        data["latency"] = [
            self._latency(100.0, self.sizes.smtp_delay),
            self._latency(max(10.0, capacity / 2), self.sizes.smtp_delay),
            self._latency(100.0, 0.0),
        ]
        data["floor"] = self._floors(self.sizes.drain_noop)
        data["load_end"] = os.getloadavg()[0]
        self.extra["efficiency"] = data
        self.log(f"efficiency: {data}")  # type: ignore[attr-defined]

    # -- helpers -----------------------------------------------------------------------

    def _server_pids(self) -> tuple[int, int]:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SHOW data_directory")
            data_dir = cur.fetchone()[0]
        connection.close()
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            pg_pid = int(f.readline())
        return pg_pid, int(self.redis.info("server")["process_id"])

    def _meter(self, extra: dict[str, int]) -> Meter:
        pg_pid, redis_pid = self._meter_base
        return Meter(pg_pid, redis_pid, extra)

    def _commands(self) -> dict[str, tuple[str, list[str]]]:
        lock = os.path.join(os.environ.get("BENCH_TMP", "/tmp"), "post_office")
        out = {"outbox": ("outbox", [sys.executable, "-m", "django", *OURS.split(), "--burst"])}
        for label, args in PO_CONFIGS.items():
            out[label] = (
                "post_office",
                [sys.executable, "-m", "django", "send_queued_mail", "-L", lock, *args],
            )
        return out

    def _one_run(
        self,
        system: str,
        argv: list[str],
        n: int,
        env: dict[str, str],
        meter: Meter,
        arrived: Any = None,
    ) -> dict[str, float]:

        self.reset()  # type: ignore[attr-defined]
        if n:
            self.seed(system, n)  # type: ignore[attr-defined]
        commits = pg_commits()
        before = meter.snap()
        _elapsed, err = run_timed([argv], env)
        if arrived is not None and n:
            _wait(lambda: arrived() >= n, 300)
        after = meter.snap()
        out = Meter.since(before, after)
        out["commits"] = pg_commits() - commits  # the empty run's are subtracted too
        done = self.delivered(system)  # type: ignore[attr-defined]
        if err or done != n:
            raise RuntimeError(f"{system}: delivered {done} of {n}; {err}")
        return out

    def _cpu_scenario(
        self,
        email: str,
        n: int,
        port: int | None,
        extra: dict[str, int],
        arrived_from: Any = None,
    ) -> dict[str, Any]:
        """Per-email steady-state CPU (run minus empty run) of each configuration."""
        env = self.env(email, port)  # type: ignore[attr-defined]
        meter = self._meter(extra)
        commands = list(self._commands().items())
        runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in commands}
        for rep in range(self.repeat):
            k = rep % len(commands)
            for label, (system, argv) in commands[k:] + commands[:k]:
                arrived = None
                if arrived_from is not None:
                    base = arrived_from()
                    arrived = lambda base=base: arrived_from() - base  # noqa: E731
                full = self._one_run(system, argv, n, env, meter, arrived)
                empty = self._one_run(system, argv, 0, env, meter)
                per = {k2: (full[k2] - empty[k2]) / n for k2 in full}
                per["rate"] = n / full["wall"]
                per["steady_rate"] = n / max(full["wall"] - empty["wall"], 1e-6)
                per["load"] = os.getloadavg()[0]
                runs[label].append(per)
                self.log(  # type: ignore[attr-defined]
                    f"cpu {email} {label}: tier {1e6 * tier(per):.0f} us/email "
                    f"(workers {1e6 * per['workers']:.0f}, pg {1e6 * per['postgres']:.0f}, "
                    f"redis {1e6 * per['redis']:.0f}), machine {1e6 * per['machine']:.0f}, "
                    f"{per['rate']:.0f}/s, load {per['load']:.1f}"
                )
        out: dict[str, Any] = {"n": n}
        for label, per_runs in runs.items():
            # The run with the median tier CPU, whole (its parts add up).
            ordered = sorted(per_runs, key=tier)
            med = dict(ordered[len(ordered) // 2])
            med["rate"] = statistics.median(r["rate"] for r in per_runs)
            med["steady_rate"] = statistics.median(r["steady_rate"] for r in per_runs)
            med["tier_all"] = [tier(r) for r in per_runs]
            out[label] = med
        po = min((out[label] for label in PO_CONFIGS), key=tier)
        out["post_office_best"] = next(label for label in PO_CONFIGS if out[label] is po)
        return out

    def _floors(self, n: int) -> dict[str, Any]:
        """What an email costs before our worker's Python (floor.py); run last: it drops indexes."""
        pg = self._meter_base[0]

        def seed(k: int) -> None:
            self.seed("outbox", k)  # type: ignore[attr-defined]

        def steps(batch: int) -> dict[str, float]:
            # The median of three: an autovacuum or a checkpoint in one window counts too.
            runs = [
                floor.steps_floor(n, batch, lambda: tree_cpu(pg), self.reset, seed)  # type: ignore[attr-defined]
                for _ in range(3)
            ]
            return sorted(runs, key=lambda r: r["postgres"])[1]

        out: dict[str, Any] = {"n": n, "steps": {str(b): steps(b) for b in floor.BATCHES}}
        out["steps"]["9-noindex"] = floor.without_hot_path_indexes(lambda: steps(9))
        with _Sink(0.0) as sink:
            out["send"] = floor.django_send_floor(min(n, 2000), sink.port)
        self.reset()  # type: ignore[attr-defined]
        redis_pid = self._meter_base[1]
        out["push"] = floor.push_floor(self.sizes.enqueue_single, lambda: pid_cpu(redis_pid))
        self.reset()  # type: ignore[attr-defined]
        self.log(f"floors: {out}")  # type: ignore[attr-defined]
        return out

    def _postfix(self, sink: _Sink) -> dict[str, Any]:
        from tests import postfix

        why = postfix.unavailable()
        if why:
            return {"skipped": why}
        server = postfix.PostfixServer(sink.port).start()
        try:
            assert server.master_pid is not None
            return self._cpu_scenario(
                "smtp",
                self.sizes.drain_smtp,
                server.port,
                {"sink": sink.proc.pid, "postfix": server.master_pid},
                arrived_from=lambda: len(sink.arrivals()),
            )
        finally:
            server.stop()

    def _enqueue_cpu(self, n: int) -> dict[str, Any]:
        from django.db import connection

        from tests.benchmark.systems import SYSTEMS

        meter = self._meter({})
        runs: dict[str, list[dict[str, float]]] = {"outbox": [], "post_office": []}
        recipients = [rcpt(i) for i in range(n)]
        names = list(runs)
        for rep in range(self.repeat):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                self.reset()  # type: ignore[attr-defined]
                connection.ensure_connection()
                before = meter.snap(own=True)
                SYSTEMS[name].enqueue_each(recipients)
                after = meter.snap(own=True)
                runs[name].append({k2: v / n for k2, v in Meter.since(before, after).items()})
        out: dict[str, Any] = {"n": n}
        for name, per_runs in runs.items():
            ordered = sorted(per_runs, key=tier)
            out[name] = ordered[len(ordered) // 2]
        return out

    def bench_latency(self) -> None:
        """Ours alone at 100/s with the 20 ms server (``--only latency``; the instant
        server's runs are the side-by-side's, side_by_side.py)."""
        data = self.extra.setdefault("latency", {"runs": []})
        for _ in range(self.repeat):
            for delay in (self.sizes.smtp_delay,):
                data["runs"].append(self._latency(100.0, delay))
                self.log(f"latency: {data['runs'][-1]}")  # type: ignore[attr-defined]

    def _latency(self, rate: float, delay: float) -> dict[str, Any]:
        """Commit-to-acceptance times at a steady offered load, with real workers."""
        from django.db import connection, transaction

        from outbox import enqueue_email
        from outbox.models import Delivery

        self.reset()  # type: ignore[attr-defined]
        n = int(rate * LATENCY_SECONDS)
        committed: dict[str, float] = {}
        with _Sink(delay) as sink:
            env = self.env("smtp", sink.port)  # type: ignore[attr-defined]
            argv = [sys.executable, "-m", "django", *OURS.split()]
            with _Workers([argv], env):
                # Warm-up: the workers are up once an email went through.
                enqueue_email(SUBJECT, BODY, SENDER, ["warmup@example.com"])
                _wait(lambda: len(sink.arrivals()) >= 1, 60)
                start = time.perf_counter()
                for i in range(n):
                    due = start + i / rate
                    pause = due - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    to = f"lat{i}@example.com"
                    with transaction.atomic():
                        transaction.on_commit(lambda to=to: committed.__setitem__(to, time.time()))
                        enqueue_email(SUBJECT, BODY, SENDER, [to])
                offered = n / (time.perf_counter() - start)
                _wait(lambda: len(sink.arrivals()) >= n + 1, 120)
                arrivals = {r: t for t, r in sink.arrivals()}
        # When each row was marked processing: the step's time, right before its send.
        claimed = {
            d.recipient: d.processing_started_at.timestamp()
            for d in Delivery.objects.only("recipient", "processing_started_at")
        }
        connection.close()
        # The first second is left out (connections and caches warming up).
        keys = [f"lat{i}@example.com" for i in range(int(rate), n)]
        ms = [1000 * (arrivals[k] - committed[k]) for k in keys]
        waited = [1000 * (claimed[k] - committed[k]) for k in keys]
        sending = [1000 * (arrivals[k] - claimed[k]) for k in keys]
        return {
            "rate": rate,
            "delay": delay,
            "offered": offered,
            "emails": len(ms),
            "p50": pctl(ms, 0.50),
            "p95": pctl(ms, 0.95),
            "p99": pctl(ms, 0.99),
            "max": max(ms),
            "waited_p50": pctl(waited, 0.50),
            "waited_p99": pctl(waited, 0.99),
            "sending_p50": pctl(sending, 0.50),
            "sending_p99": pctl(sending, 0.99),
            "load": os.getloadavg()[0],
        }


# -- the report ------------------------------------------------------------------------------

SCENARIOS = {
    "noop": "no-op backend",
    "smtp": "20 ms SMTP sink",
    "postfix": "through a private Postfix relaying to the 20 ms sink",
}


def _us(x: float) -> str:
    return f"{1e6 * x:,.0f}"


def efficiency_section(db: str, data: Any) -> list[str]:
    """The report's section: the CPU split per email, enqueue CPU and latency."""
    if not data:
        return []
    md = [
        f"## CPU per delivered email and latency ({db}; load average "
        f"{data['load_start']:.1f} at the start, {data['load_end']:.1f} at the end)",
        "",
        "Steady state: (run of n emails - the same command on an empty queue) / n, the run "
        "with the median tier CPU of the repetitions. tier = workers + PostgreSQL + "
        "redis-server (per process tree, /proc/<pid>/stat and RUSAGE_CHILDREN); machine = "
        "/proc/stat busy time, which also counts whatever else ran on the machine. "
        "µs per email; rate = emails/s from spawning the command to its exit; commits = "
        "PostgreSQL transactions per email; cores = tier CPU x the steady rate (without "
        "the start-up), of the machine's " + f"{os.cpu_count()}.",
        "",
        "| scenario | system | tier µs | workers | PostgreSQL | redis | sink | Postfix "
        "| machine µs | emails/s | commits | cores | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, title in SCENARIOS.items():
        s = data.get(key)
        if not s:
            continue
        if "skipped" in s:
            md.append(f"| {title} | skipped: {s['skipped']} | | | | | | | | | | | |")
            continue
        for label in ["outbox", *PO_CONFIGS]:
            r = s[label]
            name = OURS if label == "outbox" else label
            md.append(
                f"| {title} ({s['n']:,}) | {name} | {_us(tier(r))} | {_us(r['workers'])} "
                f"| {_us(r['postgres'])} | {_us(r['redis'])} "
                f"| {_us(r['sink']) if 'sink' in r else '-'} "
                f"| {_us(r['postfix']) if 'postfix' in r else '-'} | {_us(r['machine'])} "
                f"| {r['rate']:,.0f} | {_commits(r)} | {_cores(r)} | {r['load']:.1f} |"
            )
    md += floor.floor_section(data.get("floor"), data["noop"], data["smtp"], data["enqueue"])
    e = data["enqueue"]
    md += [
        "",
        f"Enqueue, one recipient per call ({e['n']:,} calls; this process + PostgreSQL + "
        "redis-server):",
        "",
        "| call | tier µs | caller | PostgreSQL | redis | machine µs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, call in (("outbox", "enqueue_email"), ("post_office", "mail.send")):
        r = e[name]
        md.append(
            f"| {call} | {_us(tier(r))} | {_us(r['workers'])} | {_us(r['postgres'])} "
            f"| {_us(r['redis'])} | {_us(r['machine'])} |"
        )
    md += [
        "",
        f"Latency from the enqueue's commit to the sink's acceptance ({OURS}, "
        f"running, not burst; {LATENCY_SECONDS:.0f} s per load, the first second left out):",
        "",
    ]
    md += latency_table(data["latency"])
    return md


def latency_table(runs: list[dict[str, Any]]) -> list[str]:
    """One row per latency run: the server's delay, the load, the percentiles, the split."""
    md = [
        "| server | offered load | achieved | emails | p50 ms | p95 ms | p99 ms | max ms "
        "| to the claim p50 / p99 | claim to acceptance p50 / p99 | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lat in runs:
        split = ["-", "-"]
        if "waited_p50" in lat:
            split = [
                f"{lat['waited_p50']:.1f} / {lat['waited_p99']:.1f}",
                f"{lat['sending_p50']:.1f} / {lat['sending_p99']:.1f}",
            ]
        server = f"{1000 * lat.get('delay', 0.02):.0f} ms" if lat.get("delay", 0.02) else "instant"
        md.append(
            f"| {server} | {lat['rate']:,.0f}/s | {lat['offered']:,.0f}/s | {lat['emails']:,} "
            f"| {lat['p50']:.1f} | {lat['p95']:.1f} | {lat['p99']:.1f} | {lat['max']:.1f} "
            f"| {split[0]} | {split[1]} | {lat['load']:.1f} |"
        )
    md += [
        "",
        "To the claim: from the commit until a worker's step marked the row `processing` "
        "(the step's time, right before the send). Claim to acceptance: the step's commit, "
        "building the message, the SMTP conversation and the server's delay.",
        "",
    ]
    return md


def latency_section(db: str, data: Any) -> list[str]:
    """The ``--only latency`` part's section."""
    if not data:
        return []
    return [
        f"## Latency from the enqueue's commit to the server's acceptance ({db}, {OURS}, "
        f"running, not burst; {LATENCY_SECONDS:.0f} s per run, the first second left out)",
        "",
        *latency_table(data["runs"]),
    ]


def _commits(r: dict[str, float]) -> str:
    return f"{r['commits']:.3f}" if "commits" in r else "-"


def _cores(r: dict[str, float]) -> str:
    return f"{tier(r) * r['steady_rate']:.2f}" if "steady_rate" in r else "-"


def efficiency_targets(children: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Issue 27's targets and their verdicts."""
    data = children.get("postgres", {}).get("extra", {}).get("efficiency")
    if not data:
        return []

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    out = []
    for key, title in SCENARIOS.items():
        s = data.get(key)
        if not s or "skipped" in s:
            continue
        ours, best = s["outbox"], s[s["post_office_best"]]
        r = tier(ours) / tier(best)
        out.append(
            (
                f"CPU per delivered email, {title} (PG, defaults): ours <= 0.5x post_office's best",
                f"{_us(tier(ours))} µs vs {_us(tier(best))} µs ({s['post_office_best']}) = "
                f"{r:.2f}x; machine-wide {_us(ours['machine'])} vs {_us(best['machine'])} µs",
                verdict(r <= 0.5),
            )
        )
    noop = data["noop"]
    best_rate = max(noop[label]["rate"] for label in PO_CONFIGS)
    r = noop["outbox"]["rate"] / best_rate
    out.append(
        (
            "no-op delivery (PG, defaults): documented config >= 2.0x post_office's best",
            f"{noop['outbox']['rate']:,.0f}/s vs {best_rate:,.0f}/s = {r:.2f}x",
            verdict(r >= 2.0),
        )
    )
    e = data["enqueue"]
    r = tier(e["outbox"]) / tier(e["post_office"])
    out.append(
        (
            "one-recipient enqueue_email CPU <= 0.75x post_office mail.send",
            f"{_us(tier(e['outbox']))} µs vs {_us(tier(e['post_office']))} µs = {r:.2f}x",
            verdict(r <= 0.75),
        )
    )
    low, half = data["latency"][:2]
    out.append(
        (
            "latency, commit to acceptance at 100/s (20 ms sink): shown",
            f"p50 {low['p50']:.1f} / p95 {low['p95']:.1f} / p99 {low['p99']:.1f} ms",
            "shown",
        )
    )
    out.append(
        (
            "latency at half capacity (20 ms sink): p99 < 50 ms",
            f"{half['rate']:,.0f}/s: p50 {half['p50']:.1f} / p95 {half['p95']:.1f} / "
            f"p99 {half['p99']:.1f} ms",
            verdict(half["p99"] < 50.0),
        )
    )
    return out
