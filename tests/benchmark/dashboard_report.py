"""The dashboard part's pieces of the benchmark report (report.py): its targets and its section."""

from __future__ import annotations

import statistics
from typing import Any

Target = tuple[str, str, str]  # target, measured, verdict (as in report.py)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


DASHBOARD_BUDGET_MS = 200.0
DASHBOARD_LABELS = {
    "dashboard": "GET /admin/outbox/dashboard/ (test client, logged-in superuser)",
    "metrics": "GET /outbox/metrics (one scrape, bearer token)",
    "outbox_status": "manage.py outbox_status (call_command, text)",
    "dashboard, after growth": "GET /admin/outbox/dashboard/ after the growth below "
    "(queued rows over COMPARE_LIMIT: counts compared, not ids)",
}


def dashboard_ms(times: list[float]) -> tuple[float, float, float, float]:
    """``(warm-up, median, min, max)`` in ms; the first time is the warm-up."""
    warm = [t * 1000 for t in times[1:]]
    return times[0] * 1000, statistics.median(warm), min(warm), max(warm)


def dashboard_targets(children: dict[str, dict[str, Any]]) -> list[Target]:
    """The dashboard, a scrape and outbox_status under 200 ms at a million rows (PostgreSQL)."""
    data = children.get("postgres", {}).get("extra", {}).get("dashboard")
    if not data:
        return []
    out: list[Target] = []
    for name, times in data["times"].items():
        _warm, median, _low, high = dashboard_ms(times)
        ok = median < DASHBOARD_BUDGET_MS
        rows = data["rows"] + (data.get("growth", 0) if "growth" in name else 0)
        out.append(
            (
                f"{name} at {rows:,} rows (PG) < 200 ms",
                f"median {median:.1f} ms of {len(times) - 1} (max {high:.1f} ms)",
                verdict(ok if data["rows"] >= 1_000_000 else None)
                + ("" if data["rows"] >= 1_000_000 else f" (< 200 ms: {ok}, at a smaller size)"),
            )
        )
    return out


def dashboard_section(db: str, data: Any) -> list[str]:
    """Times, the counts against an exact GROUP BY, and every query's plan."""
    md: list[str] = []
    if not data:
        return md
    md.append(f"## The dashboard at {data['rows']:,} deliveries ({db})")
    md.append("")
    md.append(
        f"Table filled in SQL in {data['seed_s']:.1f}s (tests/benchmark/dashboard_data.py), "
        f"queued rows mirrored into Redis by a full sweeper pass ({data['sweep']}). Times: one "
        "warm-up call, then the median of the next ones. The machine is shared: read the max "
        "as noise."
    )
    md.append("")
    md.append("| call | warm-up ms | median ms | min ms | max ms | < 200 ms |")
    md.append("|---|---:|---:|---:|---:|---|")
    for name, times in data["times"].items():
        warm, median, low, high = dashboard_ms(times)
        md.append(
            f"| {DASHBOARD_LABELS.get(name, name)} | {warm:.1f} | {median:.1f} | {low:.1f} "
            f"| {high:.1f} | {'yes' if median < DASHBOARD_BUDGET_MS else 'NO'} |"
        )
    md.append("")
    acc = data["accuracy"]
    md.append(
        "What the dashboard reports, next to an exact `GROUP BY status` (run untimed): just "
        f"after VACUUM ANALYZE, and after {data.get('growth', 0):,} more rows (same mix) that "
        "no ANALYZE has seen yet:"
    )
    md.append("")
    md.append("| status | exact | reported | | exact after growth | reported | |")
    md.append("|---|---:|---:|---|---:|---:|---|")
    grown = data.get("accuracy_after_growth", acc)
    for status in acc["reported"]:
        cells = []
        for part in (acc, grown):
            exact, reported = part["exact"].get(status, 0), part["reported"][status]
            if status in part["estimated"]:
                error = (reported - exact) / exact * 100 if exact else 0.0
                note = f"estimate, {error:+.2f} %"
            else:
                note = "exact" if reported == exact else "DIFFERS"
            cells.append(f"{exact:,} | {reported:,} | {note}")
        md.append(f"| {status} | {' | '.join(cells)} |")
    md.append("")
    agreement = acc["agreement"] or {}
    parts = [
        f"{key}: agrees {part['agrees']}, database {part['database']}, Redis {part['redis']}"
        for key, part in agreement.items()
    ]
    md.append("Redis against the database: " + ("; ".join(parts) or "not read") + ".")
    md.append("")
    md.append(
        "### Plans (`EXPLAIN (ANALYZE, BUFFERS)`, each outbox query of one page and one scrape)"
    )
    md.append("")
    for plan in data["plans"]:
        md.append("```sql")
        md.append(plan["sql"])
        md.append("```")
        md.append("")
        md.append("```")
        md.append(plan["plan"])
        md.append("```")
        md.append("")
    return md
