"""``outbox/db.py``: rows read by column name (``rows_by_name``)."""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

import pytest

from outbox.db import RowReader


class Pair(NamedTuple):
    id: int
    name: str
    note: str = "none"


def cursor(sql: str) -> sqlite3.Cursor:
    return sqlite3.connect(":memory:").execute(sql)


def test_columns_are_matched_by_name_whatever_their_order():
    found = cursor("SELECT 'a' AS name, 7 AS id, 'n' AS note")
    assert RowReader().one(Pair, found, found.fetchone()) == Pair(id=7, name="a", note="n")


def test_a_field_with_a_default_may_have_no_column():
    found = cursor("SELECT 'a' AS name, 7 AS id UNION ALL SELECT 'b', 8")
    rows = RowReader().all(Pair, found, found.fetchall())
    assert rows == [Pair(7, "a"), Pair(8, "b")]


def test_a_missing_column_is_named():
    found = cursor("SELECT 7 AS id, 'x' AS label")
    with pytest.raises(LookupError, match="no column 'name'"):
        RowReader().one(Pair, found, found.fetchone())
