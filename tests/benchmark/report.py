"""The benchmark's report: the results table next to the previous run's, and the targets.

``build_report`` writes the Markdown of ``results/latest.md``: machine and
parameters, one results line per scenario, database and configuration (with
``x ours``, the rate relative to our best), the targets, and per database the
worker's per-email counts, the sweeper pass times and the profile.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.benchmark.admin_scale_report import admin_scale_section
from tests.benchmark.common import Row
from tests.benchmark.dashboard_report import dashboard_section
from tests.benchmark.efficiency import efficiency_section, latency_section
from tests.benchmark.memory import memory_section
from tests.benchmark.sending import sending_section
from tests.benchmark.side_by_side import side_by_side_section
from tests.benchmark.targets import evaluate_targets


def machine_info(children: dict[str, dict[str, Any]]) -> dict[str, str]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    redis_version = ""
    with contextlib.suppress(Exception):
        redis_version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2]
    info = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "os": platform.platform(),
        "python": platform.python_version(),
        "Django": metadata.version("Django"),
        "django-email-outbox": metadata.version("django-email-outbox"),
        "django-post-office": metadata.version("django-post_office"),
        "django-mailer": metadata.version("django-mailer"),
        "redis-server": redis_version.removeprefix("v="),
    }
    for db, data in children.items():
        info[db] = data["extra"].get("db_version", "")
    return info


def fmt_rate(x: float) -> str:
    return "-" if x != x else f"{x:,.0f}"


Key = tuple[str, str, str, str]  # scenario, db, system, configuration


def previous_rates(path: Path) -> dict[Key, float]:
    """The emails/s of each results line of an earlier report (its Markdown table)."""
    rates: dict[Key, float] = {}
    if not path.exists():
        return rates
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or cells[0] in ("scenario", "---") or cells[0].startswith("-"):
            continue
        config = re.sub(r" \(delivered .*\)$", "", cells[3])
        with contextlib.suppress(ValueError):
            rates[(cells[0], cells[1], cells[2], config)] = float(cells[6].replace(",", ""))
    return rates


def previous_targets(path: Path) -> dict[str, str]:
    """The measured figure and verdict of each target of an earlier report, by its name."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    text = path.read_text()
    if "## Targets" not in text:
        return out
    for line in text[text.index("## Targets") :].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("target", "---") and not cells[0].startswith("-"):
            out[cells[0]] = f"{cells[1]} ({cells[2]})"
    return out


def results_table(rows: list[Row], params: dict[str, Any], previous: dict[Key, float]) -> str:
    """The results: one line per scenario, database and system configuration.

    ``previous`` is the earlier report's figure for the same line, where it had one.
    """
    titles = {
        "enqueue-bulk": "Enqueue: one call, many recipients",
        "enqueue-single": "Enqueue: one-recipient calls",
        "deliver-noop": "Delivery, no-op backend (dummy EmailBackend)",
        "deliver-smtp": f"Delivery to loopback SMTP, {params['smtp_delay'] * 1000:.0f} ms per message",
        "scale": "Scale: our delivery rate vs rows already in the Delivery table (PostgreSQL)",
        "bulk": "Personalised template emails, one call (PostgreSQL)",
    }
    out: list[str] = []
    out.append(
        "| scenario | db | system | configuration | emails | median s | emails/s | x ours "
        "| previous emails/s |"
    )
    out.append("|---|---|---|---|---:|---:|---:|---:|---:|")
    for section in titles:
        for db in ("postgres", "sqlite"):
            group = [r for r in rows if r.section == section and r.db == db]
            if not group:
                continue
            ours = [r for r in group if r.ours]
            if section == "scale":
                ref = ours[0].rate if ours else float("nan")
            else:
                ref = max((r.rate for r in ours), default=float("nan"))
            for r in group:
                ratio = r.rate / ref if ref == ref and ref else float("nan")
                note = f" ({r.note})" if r.note else ""
                before = previous.get((section, db, r.system, r.config), float("nan"))
                out.append(
                    f"| {section} | {db} | {r.system} | {r.config}{note} | {r.n:,} | {r.median:.3f} "
                    f"| {fmt_rate(r.rate)} | {'-' if ratio != ratio else f'{ratio:.2f}'} "
                    f"| {fmt_rate(before)} |"
                )
    table = "\n".join(out)
    return table


def build_report(
    rows: list[Row],
    children: dict[str, dict[str, Any]],
    info: dict[str, str],
    params: dict[str, Any],
    previous_report: Path,
) -> tuple[str, list[tuple[str, str, str]]]:
    """The Markdown report (results/latest.md) and the targets' verdicts.

    ``previous_report`` is the report this one replaces: its figures are
    shown next to the new ones, in the results and in the targets.
    """
    previous = previous_rates(previous_report)
    table = results_table(rows, params, previous)

    targets = evaluate_targets(rows, children, previous)
    md: list[str] = ["# Email outbox benchmark", ""]
    if params.get("note"):
        md += [f"**{params['note']}**", ""]
    md.append(
        "Produced by `tests/benchmark/run.sh` (tests/benchmark/run.py). Rates are emails per second, median of "
        f"{params['repeat']} run(s), each repetition starting with the next system; `x ours` is each row's rate divided by our best configuration "
        "in the same scenario and database (for enqueue: by `enqueue_email`; for scale: by the "
        "first history size). Delivery times are wall-clock from spawning the management command "
        "to its exit, identical for all three systems, so each includes one Python + Django "
        "start-up. Each measurement starts from empty tables and an empty Redis."
    )
    md.append("")
    md.append("## Machine and parameters")
    md.append("")
    for k, v in info.items():
        md.append(f"- {k}: {v}")
    for k, v in params.items():
        md.append(f"- {k}: {v}")
    md.append("")
    md.append("## Results")
    md.append("")
    md.append(table)
    md.append("")
    md.append("## Targets")
    md.append("")
    md.append(
        f"Previous figures are from the report this run replaced ({previous_report.name}, "
        "same machine kind), where it had the same line."
    )
    md.append("")
    before = previous_targets(previous_report)
    md.append("| target | measured | verdict | previous report |")
    md.append("|---|---|---|---|")
    for name, measured, verdict in targets:
        was = before.get(name)
        md.append(f"| {name} | {measured} | {verdict} | {was or '-'} |")
    md.append("")
    for db, data in children.items():
        md += counts_section(db, data["extra"].get("counts"))
        md += scale_section(db, data["extra"].get("scale"))
        md += profile_section(db, data["extra"].get("profile"))
        md += dashboard_section(db, data["extra"].get("dashboard"))
        md += admin_scale_section(db, data["extra"].get("admin_scale"))
        md += sending_section(db, data["extra"].get("sending"))
        md += efficiency_section(db, data["extra"].get("efficiency"))
        md += side_by_side_section(db, data["extra"].get("side_by_side"), info)
        md += latency_section(db, data["extra"].get("latency"))
        md += memory_section(db, data["extra"].get("memory"))
    return "\n".join(md) + "\n", targets


def counts_section(db: str, counts: Any) -> list[str]:
    """Our worker, per delivered email: what the instruments counted."""
    md: list[str] = []
    if not counts:
        return md
    md.append(f"## Our worker, per delivered email ({db}, in-process, concurrency 1)")
    md.append("")
    md.append(
        "SQL statements: counted by an execute_wrapper installed on every connection "
        "(connection_created). Commits: explicit COMMITs (transaction.atomic) counted by "
        "wrapping the backend's `_commit`, plus statements run in autocommit mode (each is "
        "its own transaction); `write commits` are the ones that carry writes (WAL flush). "
        "`pg_xact_commit` is the server's pg_stat_database delta (every transaction, "
        "read-only ones included); `pg_wal_sync` the pg_stat_wal fsync delta (cluster). "
        "Redis round trips: client-side, by wrapping redis-py's `Redis.execute_command` "
        "and `Pipeline.execute` (EVALSHA of the claim script = 1); server commands: INFO "
        "stats total_commands_processed delta. Heartbeat/register traffic is included."
    )
    if db == "sqlite":
        md.append("")
        md.append(
            "On SQLite the worker's step runs on the DB-API connection (one BEGIN IMMEDIATE "
            "... COMMIT per email, see outbox/worker/sql.py `_steps_sqlite`), outside Django's "
            "execute wrappers and `_commit`: the SQL counts below miss it. The wall time and "
            "the Redis counts are complete."
        )
    md.append("")
    md.append("| measure | per email |")
    md.append("|---|---:|")
    for k, v in counts.items():
        if isinstance(v, float):
            v = f"{v:.3f}"
        md.append(f"| {k} | {v} |")
    md.append("")
    return md


def scale_section(db: str, scale: Any) -> list[str]:
    """The sweeper pass times of the scale check."""
    md: list[str] = []
    if not scale:
        return md
    md.append(f"## Sweeper pass time vs table size ({db})")
    md.append("")
    md.append("| rows in Delivery | full pass s | incremental pass s |")
    md.append("|---:|---:|---:|")
    for _size, s in scale.items():
        md.append(f"| {s['rows']:,} | {s['sweep_full_s']:.3f} | {s['sweep_incremental_s']:.3f} |")
    md.append("")
    return md


def profile_section(db: str, prof: Any) -> list[str]:
    """The cProfile tables of one drain."""
    md: list[str] = []
    if not prof:
        return md
    md.append(
        f"## cProfile of one drain ({db}, {prof['n']} emails, {prof['wall']:.2f}s with "
        "the profiler on, sender loop in the main thread)"
    )
    md.append("")
    md.append("Top functions by own time:")
    md.append("")
    md.append("```")
    md.append(prof["tottime"])
    md.append("```")
    md.append("")
    md.append("Top by cumulative time (outbox, django, redis, psycopg):")
    md.append("")
    md.append("```")
    md.append(prof["cumulative"])
    md.append("```")
    md.append("")
    return md
