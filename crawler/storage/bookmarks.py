"""How far each ``scrapy reparse --follow`` has read: :class:`FollowBookmarks`.

A follower of a crawl reads its catalog's page log (``_page_log``,
crawler/storage/items.py) and keeps its position per spider in ``_follow_progress``;
a follower of a Slurm DATA/ keeps one per shipped catalog in ``_follow_shipped``. A
shipment leaves out the pages whose archive is not shipped yet, and a later one brings
them with their earlier numbers: ``gaps`` lists the numbers below ``seq`` not seen yet
(JSON), so that they are parsed when they come. A bookmark is saved in the
transaction of the items it parsed (``ItemTableWriter.write(..., then=...)``), so
that a follower resumes exactly after them (crawler/reparse/follow.py).
"""

from __future__ import annotations

import json
import sqlite3

FOLLOW_TABLE = "_follow_progress"
FOLLOW_SQL = f"""
CREATE TABLE IF NOT EXISTS {FOLLOW_TABLE} (
    spider TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    pages INTEGER NOT NULL
)"""
FOLLOW_SHIPPED_TABLE = "_follow_shipped"
FOLLOW_SHIPPED_SQL = f"""
CREATE TABLE IF NOT EXISTS {FOLLOW_SHIPPED_TABLE} (
    spider TEXT NOT NULL,
    catalog TEXT NOT NULL,
    seq INTEGER NOT NULL,
    gaps TEXT NOT NULL,
    pages INTEGER NOT NULL,
    PRIMARY KEY (spider, catalog)
)"""


class FollowBookmarks:
    """The page log positions each follower reached, read and saved in the database
    its items go to."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def position(self, spider: str) -> int:
        """The page log position a follower of ``spider`` reached (0: none)."""
        self.conn.execute(FOLLOW_SQL)
        got = self.conn.execute(
            f"SELECT seq FROM {FOLLOW_TABLE} WHERE spider = ?", (spider,)
        ).fetchone()
        return got[0] if got else 0

    def save(self, spider: str, seq: int, pages: int) -> None:
        """A follower of ``spider`` reached ``seq``, having read ``pages`` more."""
        self.conn.execute(FOLLOW_SQL)
        self.conn.execute(
            f"INSERT INTO {FOLLOW_TABLE} VALUES (?, ?, ?) ON CONFLICT (spider) "
            "DO UPDATE SET seq = excluded.seq, pages = pages + excluded.pages",
            (spider, seq, pages),
        )

    def shipped_positions(self, spider: str) -> dict[str, tuple[int, set[int]]]:
        """Shipped catalog name -> (position, gaps) a follower of ``spider`` reached."""
        self.conn.execute(FOLLOW_SHIPPED_SQL)
        got = self.conn.execute(
            f"SELECT catalog, seq, gaps FROM {FOLLOW_SHIPPED_TABLE} WHERE spider = ?", (spider,)
        )
        return {name: (seq, set(json.loads(gaps))) for name, seq, gaps in got}

    def save_shipped(
        self, spider: str, catalog: str, seq: int, gaps: set[int] | list[int], pages: int
    ) -> None:
        """A follower of ``spider`` reached ``seq`` (with ``gaps``) in ``catalog``."""
        self.conn.execute(FOLLOW_SHIPPED_SQL)
        self.conn.execute(
            f"INSERT INTO {FOLLOW_SHIPPED_TABLE} VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (spider, catalog) DO UPDATE SET seq = excluded.seq, "
            "gaps = excluded.gaps, pages = pages + excluded.pages",
            (spider, catalog, seq, json.dumps(sorted(gaps)), pages),
        )
