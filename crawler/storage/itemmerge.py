"""Item tables across catalogs: trimmed with a shipped copy, merged with the rows.

A catalog shipped from a Slurm task keeps only the rows whose archives are shipped
(``keep_archives``): :func:`prune_items` drops the items of the pages it removed. A
merge keeps the newest fetch of each page (``Catalog.merge_from``):
:func:`merge_items_from` then brings the items of the pages whose row came from the
merged catalog, replacing what the target held for those pages and spiders.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crawler.storage.catalog import attached, transaction
from crawler.storage.items import (
    INCOMPLETE_SQL,
    INCOMPLETE_TABLE,
    KEY_INDEX_SUFFIX,
    PAGE_LOG,
    PAGE_LOG_SQL,
    PAGES_SQL,
    PAGES_TABLE,
    item_table_names,
)
from crawler.storage.items import quote as q


def _columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> dict[str, str]:
    rows = conn.execute(f"PRAGMA {schema}.table_info({q(table)})").fetchall()
    return {r[1]: r[2] for r in rows}


def prune_items(conn: sqlite3.Connection) -> int:
    """Delete items (and bookkeeping) of pages without a row; returns items deleted."""
    gone = "_key NOT IN (SELECT key FROM artifacts)"
    deleted = 0
    with transaction(conn):
        for table in item_table_names(conn):
            deleted += conn.execute(f"DELETE FROM {q(table)} WHERE {gone}").rowcount
        for table in (PAGES_TABLE, PAGE_LOG, INCOMPLETE_TABLE):
            if _columns(conn, table):
                conn.execute(f"DELETE FROM {table} WHERE {gone}")
    return deleted


def merge_items_from(conn: sqlite3.Connection, path: str | Path) -> int:
    """After merging the rows of catalog ``path`` into ``conn``'s: the items of the
    pages whose row came from it (same key and fetch time). Returns items copied."""
    copied = 0
    with attached(conn, path):
        if not _columns(conn, PAGES_TABLE, "src"):
            return 0
        with transaction(conn):
            conn.execute(PAGES_SQL)
            conn.execute(PAGE_LOG_SQL)
            conn.execute(
                "CREATE TEMP TABLE won AS SELECT s.key FROM src.artifacts s "
                "JOIN main.artifacts m ON m.key = s.key AND m.fetched_at = s.fetched_at"
            )
            pages = (
                f"SELECT _key, _spider FROM src.{PAGES_TABLE} "
                "WHERE _key IN (SELECT key FROM temp.won)"
            )
            for table in item_table_names(conn):
                conn.execute(f"DELETE FROM main.{q(table)} WHERE (_key, _spider) IN ({pages})")
            for table in item_table_names(conn, "src"):
                copied += _copy_table(conn, table)
            conn.execute(
                f"INSERT OR REPLACE INTO main.{PAGES_TABLE} SELECT * FROM src.{PAGES_TABLE} "
                "WHERE _key IN (SELECT key FROM temp.won)"
            )
            if _columns(conn, INCOMPLETE_TABLE):
                conn.execute(
                    f"DELETE FROM main.{INCOMPLETE_TABLE} WHERE (_key, _spider) IN ({pages})"
                )
            if _columns(conn, INCOMPLETE_TABLE, "src"):
                conn.execute(INCOMPLETE_SQL)
                conn.execute(
                    f"INSERT OR IGNORE INTO main.{INCOMPLETE_TABLE} SELECT _key, _spider "
                    f"FROM src.{INCOMPLETE_TABLE} WHERE _key IN (SELECT key FROM temp.won)"
                )
            if _columns(conn, PAGE_LOG, "src"):
                conn.execute(
                    f"INSERT INTO main.{PAGE_LOG} (_key) SELECT _key FROM src.{PAGE_LOG} "
                    f"WHERE _key IN (SELECT key FROM temp.won) "
                    f"AND _key NOT IN (SELECT _key FROM main.{PAGE_LOG}) ORDER BY seq"
                )
            conn.execute("DROP TABLE temp.won")
    return copied


def _copy_table(conn: sqlite3.Connection, table: str) -> int:
    src_cols = _columns(conn, table, "src")
    have = _columns(conn, table)
    if not have:
        (sql,) = conn.execute(
            "SELECT sql FROM src.sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        conn.execute(sql)  # created in main
        # Tables keyed by (_key, _seq) are searched by that key; a natural key's table
        # has an index of its pages (ItemTables.ensure).
        index = table + KEY_INDEX_SUFFIX
        if conn.execute(
            "SELECT 1 FROM src.sqlite_master WHERE type = 'index' AND name = ?", (index,)
        ).fetchone():
            conn.execute(
                f"CREATE INDEX IF NOT EXISTS main.{q(index)} ON {q(table)} (_key, _spider)"
            )
    for column, decl in src_cols.items():
        if have and column not in have:
            conn.execute(f"ALTER TABLE main.{q(table)} ADD COLUMN {q(column)} {decl}".rstrip())
    cols = ", ".join(map(q, src_cols))
    return conn.execute(
        f"INSERT OR REPLACE INTO main.{q(table)} ({cols}) SELECT {cols} FROM src.{q(table)} "
        "WHERE _key IN (SELECT key FROM temp.won)"
    ).rowcount
