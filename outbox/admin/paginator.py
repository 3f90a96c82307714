"""A paginator for admin lists over tables of millions of rows.

Used by the outbox's admin (and re-exported as
``outbox.admin.paginator.EstimatedCountPaginator``); it knows nothing of the outbox's
models, so it lives apart from the ModelAdmins.
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property


class EstimatedCountPaginator(Paginator):
    """A paginator that does not count a large unfiltered table row by row.

    On PostgreSQL, ``SELECT COUNT(*)`` reads the whole table (or its primary
    key index). For the unfiltered list, the planner's estimate
    (``pg_class.reltuples``, kept fresh by autovacuum) is used instead once it
    passes :attr:`estimate_threshold`. Filtered or searched lists, small tables,
    tables never analysed and other databases get an exact count.
    """

    estimate_threshold = 100_000

    @cached_property
    def count(self) -> int:
        estimate = self.estimated_count()
        if estimate is not None and estimate >= self.estimate_threshold:
            return estimate
        return super().count

    def estimated_count(self) -> int | None:
        """The planner's row estimate for an unfiltered queryset, or None."""
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return None
        query = queryset.query
        if query.where or query.is_sliced or query.distinct or query.combinator:
            return None
        connection = connections[queryset.db]
        if connection.vendor != "postgresql":
            return None
        table = connection.ops.quote_name(queryset.model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table])
            row = cursor.fetchone()
        # reltuples is -1 (PostgreSQL >= 14) or 0 for a table never analysed.
        if row is None or row[0] is None or row[0] <= 0:
            return None
        return int(row[0])
