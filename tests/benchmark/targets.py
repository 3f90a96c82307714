"""The benchmark's targets and their verdicts.

The targets ("win at Django's defaults"), measured with Django's
default DATABASES options (no ``prepare_threshold``, CONN_MAX_AGE 0):

- no-op delivery by the documented worker configuration >= 1.2x post_office's
  ``send_queued_mail``, command start to exit;
- one-recipient ``enqueue_email`` >= 1.0x ``post_office.mail.send``, Redis push
  included;
- 20 ms SMTP delivery by the documented configuration >= 3x post_office;
- with prepared statements, each of those figures at least as good;
- at most one commit and one Redis round trip per delivered email;
- SQLite: delivery >= 0.8x post_office.

And, kept from the first benchmark: >= 3x django-mailer, bulk enqueue, and the
delivery rate with a million rows of history. Each measured figure is shown
with the previous report's figure for the same line, where it had one.
"""

from __future__ import annotations

from typing import Any

from tests.benchmark.admin_scale_report import admin_scale_targets
from tests.benchmark.common import Row
from tests.benchmark.dashboard_report import dashboard_targets
from tests.benchmark.efficiency import efficiency_targets
from tests.benchmark.sending import sending_targets
from tests.benchmark.system_outbox import DOCUMENTED

Target = tuple[str, str, str]  # target, measured, verdict
Key = tuple[str, str, str, str]
PREPARED = "prepared statements"


def get(
    rows: list[Row], section: str, system: str, db: str = "postgres", config: str | None = None
) -> list[Row]:
    return [
        r
        for r in rows
        if r.section == section
        and r.system == system
        and r.db == db
        and (config is None or config == r.config)
    ]


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def _was(row: Row, previous: dict[Key, float]) -> str:
    before = previous.get((row.section, row.db, row.system, row.config))
    return f" (previous {before:,.0f}/s)" if before else ""


def _documented(rows: list[Row], section: str, db: str, prepared: bool = False) -> Row | None:
    """Our best row among the configurations the README documents for this database."""
    suffix = f", {PREPARED}" if prepared else ""
    found = [r for c in DOCUMENTED[db] for r in get(rows, section, "outbox", db, c + suffix)]
    return max(found, key=lambda r: r.rate) if found else None


def evaluate_targets(
    rows: list[Row], children: dict[str, dict[str, Any]], previous: dict[Key, float]
) -> list[Target]:
    """Every target with what was measured and a verdict."""
    return [
        *delivery_targets(rows, previous),
        *enqueue_targets(rows, previous),
        *counts_targets(children),
        *scale_target(rows, children),
        *dashboard_targets(children),
        *admin_scale_targets(children),
        *bulk_targets(rows),
        *sending_targets(children),
        *efficiency_targets(children),
    ]


def _versus(
    name: str, ours: Row | None, theirs: Row | None, ratio: float, previous: dict[Key, float]
) -> list[Target]:
    if ours is None or theirs is None:
        return []
    r = ours.rate / theirs.rate
    measured = (
        f"{ours.config}: {ours.rate:,.0f}/s{_was(ours, previous)} vs "
        f"{theirs.rate:,.0f}/s{_was(theirs, previous)} = {r:.2f}x"
    )
    return [(name, measured, verdict(r >= ratio))]


def _first(rows: list[Row]) -> Row | None:
    return rows[0] if rows else None


def delivery_targets(rows: list[Row], previous: dict[Key, float]) -> list[Target]:
    """No-op and SMTP delivery against post_office and django-mailer."""
    out: list[Target] = []
    po = _first(get(rows, "deliver-noop", "post_office"))
    ml = _first(get(rows, "deliver-noop", "mailer"))
    noop = _documented(rows, "deliver-noop", "postgres")
    out += _versus(
        "no-op delivery (PG, defaults): documented config >= 1.2x post_office",
        noop,
        po,
        1.2,
        previous,
    )
    out += _versus(
        "no-op delivery (PG, defaults): documented config >= 3x django-mailer",
        noop,
        ml,
        3.0,
        previous,
    )
    prepared = _documented(rows, "deliver-noop", "postgres", prepared=True)
    if noop is not None and prepared is not None:
        out.append(
            (
                "no-op delivery (PG): prepared statements at least as good as defaults (3% noise allowed)",
                f"{prepared.rate:,.0f}/s vs {noop.rate:,.0f}/s",
                verdict(prepared.rate >= noop.rate * 0.97),  # within noise
            )
        )
    out += _versus(
        "20 ms SMTP (PG, defaults): documented config >= 3x post_office",
        _documented(rows, "deliver-smtp", "postgres"),
        _first(get(rows, "deliver-smtp", "post_office")),
        3.0,
        previous,
    )
    out += _versus(
        "no-op delivery (SQLite): documented config >= 0.8x post_office",
        _documented(rows, "deliver-noop", "sqlite"),
        _first(get(rows, "deliver-noop", "post_office", "sqlite")),
        0.8,
        previous,
    )
    return out


def enqueue_targets(rows: list[Row], previous: dict[Key, float]) -> list[Target]:
    """Enqueueing: one-recipient calls, and 10,000 recipients in one call."""
    out: list[Target] = []
    single = _first(get(rows, "enqueue-single", "outbox", config="enqueue_email"))
    out += _versus(
        "one-recipient enqueue_email (PG, defaults) >= 1.0x post_office mail.send",
        single,
        _first(get(rows, "enqueue-single", "post_office")),
        1.0,
        previous,
    )
    single_prepared = _first(
        get(rows, "enqueue-single", "outbox", config=f"enqueue_email, {PREPARED}")
    )
    if single is not None and single_prepared is not None:
        out.append(
            (
                "one-recipient enqueue_email (PG): prepared at least as good as defaults (3% noise allowed)",
                f"{single_prepared.rate:,.0f}/s vs {single.rate:,.0f}/s",
                verdict(single_prepared.rate >= single.rate * 0.97),  # within noise
            )
        )
    bulk = sorted(get(rows, "enqueue-bulk", "outbox"), key=lambda r: r.median)
    if bulk:
        fast = bulk[0].median < 0.5 and bulk[0].n >= 10_000
        out.append(
            (
                "enqueue 10,000 recipients (PG) < 0.5 s",
                f"{bulk[0].config}: {bulk[0].n:,} in {bulk[0].median:.3f}s",
                verdict(fast if bulk[0].n >= 10_000 else None),
            )
        )
    out += _versus(
        "enqueue bulk (PG) >= 2x post_office send_many",
        bulk[0] if bulk else None,
        _first(get(rows, "enqueue-bulk", "post_office")),
        2.0,
        previous,
    )
    return out


def counts_targets(children: dict[str, dict[str, Any]]) -> list[Target]:
    """Commits and Redis round trips per delivered email (PostgreSQL)."""
    out: list[Target] = []
    counts = children.get("postgres", {}).get("extra", {}).get("counts")
    if counts:
        # A drain of n emails commits n steps (each the claim of one email with the
        # success of the one before) plus the last success on its own: (n + 1) / n.
        n = counts["delivered"]
        writes = counts["write_commits"] * n
        out.append(
            (
                "<= 1 commit per delivered email (PG), plus the last outcome of a drain",
                f"{writes:.0f} write commits for {n:,} emails = {counts['write_commits']:.3f} "
                f"per email; {counts['transactions']:.3f} transactions incl. read-only; "
                f"pg xact_commit {counts.get('pg_xact_commit', 0):.3f}",
                verdict(round(writes) <= n + 1),
            )
        )
        out.append(
            (
                "<= 1 Redis round trip per delivered email",
                f"{counts['redis_round_trips']:.3f} (client-side)",
                verdict(counts["redis_round_trips"] <= 1.0),
            )
        )
    return out


def scale_target(rows: list[Row], children: dict[str, dict[str, Any]]) -> list[Target]:
    """The delivery rate with a large history in the table."""
    out: list[Target] = []
    scale = get(rows, "scale", "outbox")
    if len(scale) == 2:
        small, big = scale
        r = big.rate / small.rate
        sizes = children["postgres"]["extra"]["scale"]
        sweeps = ", ".join(f"{int(k):,}: {v['sweep_full_s']:.3f}s" for k, v in sizes.items())
        out.append(
            (
                f"rate at {big.config.split(' rows')[0]} rows within 10% of {small.config.split(' rows')[0]}",
                f"{big.rate:,.0f}/s vs {small.rate:,.0f}/s = {r:.2f}x; sweeper full pass {sweeps}",
                verdict(r >= 0.9),
            )
        )
    return out


def bulk_targets(rows: list[Row]) -> list[Target]:
    """Issue 14: 10,000 personalised template emails (PG) < 3 s and >= 3x post_office."""
    ours = get(rows, "bulk", "outbox")
    po = get(rows, "bulk", "post_office")
    if not ours:
        return []
    r = ours[0]
    out: list[Target] = [
        (
            "bulk: 10,000 template emails through enqueue_many (PG) < 3 s",
            f"{r.n:,} in {r.median:.3f}s ({r.rate:,.0f}/s)",
            verdict(r.median < 3.0 if r.n >= 10_000 else None),
        )
    ]
    if po:
        ratio = r.rate / po[0].rate
        out.append(
            (
                "bulk (PG) >= 3x post_office send_many with a template",
                f"{r.rate:,.0f}/s vs {po[0].rate:,.0f}/s = {ratio:.2f}x",
                verdict(ratio >= 3.0),
            )
        )
    return out
