"""A paginator for admin lists over tables of millions of rows.

Used by the outbox's admin (and re-exported as
``outbox.admin.paginator.EstimatedCountPaginator``); it knows nothing of the outbox's
models, so it lives apart from the ModelAdmins.
"""

from __future__ import annotations

import json

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property


class EstimatedCountPaginator(Paginator):
    """A paginator that does not count a large list row by row.

    On PostgreSQL, ``SELECT COUNT(*)`` reads every matching row (or index
    entry): half a second per few million. So once the planner expects at
    least :attr:`estimate_threshold` rows, its estimate is the count: for the
    unfiltered list ``pg_class.reltuples`` (kept fresh by autovacuum), for a
    filtered one the row estimate of the list's own query (``EXPLAIN``, from
    the column statistics that autovacuum's ANALYZE keeps: for a filter on a
    status or a priority, within a per cent or two). Lists the planner expects
    to be shorter, tables never analysed and other databases are counted
    exactly; :attr:`estimated` says which it was. Only the list's count (its
    pagination line) is estimated: the rows shown are always read. A filter
    that no index serves and that the planner expects to match fewer rows than
    the threshold (a date range of a few days, say) is still counted by reading
    the table.
    """

    estimate_threshold = 100_000

    # Whether :attr:`count` is the planner's estimate (set when it is read).
    estimated = False

    @cached_property
    def count(self) -> int:
        estimate = self.estimated_count()
        if estimate is not None and estimate >= self.estimate_threshold:
            self.estimated = True
            return estimate
        return super().count

    def estimated_count(self) -> int | None:
        """The planner's row estimate for the queryset, or None where there is none."""
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return None
        query = queryset.query
        if query.is_sliced or query.distinct or query.combinator:
            return None
        connection = connections[queryset.db]
        if connection.vendor != "postgresql":
            return None
        if query.where:
            return _planned_rows(queryset)
        table = connection.ops.quote_name(queryset.model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table])
            row = cursor.fetchone()
        # reltuples is -1 (PostgreSQL >= 14) or 0 for a table never analysed.
        if row is None or row[0] is None or row[0] <= 0:
            return None
        return int(row[0])


def _planned_rows(queryset: QuerySet) -> int | None:
    """The rows PostgreSQL's planner expects ``queryset`` to return (``EXPLAIN``, not run)."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    rows = plan[0]["Plan"].get("Plan Rows")
    return None if rows is None else int(rows)
