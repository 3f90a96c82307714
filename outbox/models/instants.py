"""Instants: the times a decision is made by, stored in UTC whatever ``USE_TZ`` says.

A row's ``not_before`` and ``expires_at`` are compared with a clock by the
claim, the sweeper, a requeue and the mirror rebuild, each reading the stored
value again. With ``USE_TZ = False`` Django stores a datetime naive in
``TIME_ZONE``, and the night the clocks go back a wall-clock time such as
01:30 happens twice: every later read would pick the first, an hour early.
So :class:`InstantField` stores UTC as Django does with ``USE_TZ = True``
(``timestamptz`` on PostgreSQL, UTC text on SQLite), whatever ``USE_TZ``
says, and gives the ORM Django's usual values: aware UTC with ``USE_TZ``,
else naive in ``TIME_ZONE`` with ``fold`` saying which of a repeated hour's
two times it is (PEP 495). A naive value written is read that way too.

Python code that compares or converts such values goes through
:func:`instant` (or :func:`epoch`): comparing two naive datetimes ignores
``fold``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone


def instant(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime; a naive one is read in ``TIME_ZONE``, ``fold`` kept."""
    if timezone.is_naive(moment):
        # replace(), not make_aware(): the latter may drop fold on older Djangos.
        moment = moment.replace(tzinfo=timezone.get_default_timezone())
    return moment.astimezone(UTC)


def epoch(moment: datetime) -> float:
    """``moment`` as epoch seconds (a naive one read as :func:`instant` reads it)."""
    return instant(moment).timestamp()


def as_django_stores(moment: datetime) -> datetime:
    """``moment`` as the ORM gives datetimes: aware UTC with ``USE_TZ``, else naive in ``TIME_ZONE``.

    The naive form keeps ``fold``, so :func:`instant` gets the same instant back.
    """
    aware = instant(moment)
    if settings.USE_TZ:
        return aware
    return aware.astimezone(timezone.get_default_timezone()).replace(tzinfo=None)


class InstantField(models.DateTimeField):
    """A ``DateTimeField`` stored in UTC whatever ``USE_TZ`` says (module docstring)."""

    def get_db_prep_value(
        self, value: Any, connection: BaseDatabaseWrapper, prepared: bool = False
    ) -> Any:
        if not prepared:
            value = self.get_prep_value(value)
        if settings.USE_TZ or not isinstance(value, datetime):
            return super().get_db_prep_value(value, connection, prepared=True)
        moment = instant(value)
        if not connection.features.supports_timezones:
            # SQLite refuses an aware datetime without USE_TZ: UTC text, naive.
            moment = moment.replace(tzinfo=None)
        return connection.ops.adapt_datetimefield_value(moment)

    def from_db_value(self, value: Any, expression: Any, connection: BaseDatabaseWrapper) -> Any:
        if value is None or settings.USE_TZ:
            return value
        if timezone.is_naive(value) and not connection.features.supports_timezones:
            value = value.replace(tzinfo=UTC)  # SQLite: the UTC text stored above
        # PostgreSQL (naive in the session's zone, TIME_ZONE, fold set by psycopg): as it is.
        return as_django_stores(value) if timezone.is_aware(value) else value


def stored(moment: datetime | None, connection: BaseDatabaseWrapper) -> Any:
    """``moment`` as a raw statement's parameter for an instant column: what the ORM writes."""
    # As an aware instant: a naive one is read in TIME_ZONE (fold kept), without
    # the warning Django gives a naive value under USE_TZ.
    return InstantField().get_db_prep_value(None if moment is None else instant(moment), connection)
