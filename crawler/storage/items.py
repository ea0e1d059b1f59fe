"""Item tables in the catalog database, written with the rows of their pages.

A page's items cross to the writer process as a :class:`PageItems` once the callback
that parsed the page is done. :class:`ItemStore` holds the page's catalog row until
then, so that the row and the items are committed in one transaction: after a kill,
a page has a row with all of its items, or neither (and is fetched again).

Tables are created on demand, outside the catalog's numbered migrations: their
columns are the items' fields, which only the spiders know. ``_item_pages`` records,
per page and spider, which tables hold its items, so that parsing a page again
replaces them wherever they are; ``_page_log`` numbers the pages in the order a crawl
committed their rows (how far each ``reparse --follow`` has read it is its bookmark:
crawler/storage/bookmarks.py).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from crawler.storage.catalog import Catalog
from crawler.storage.itemvalues import value_type

logger = logging.getLogger(__name__)

PAGES_TABLE = "_item_pages"
# Pages in the order their rows were committed by a crawl (a follower's position).
PAGE_LOG = "_page_log"
# Pages whose records an items crawl's recovery indexed from the archive: their rows
# are committed before their items are parsed, so the list is kept until they are (a
# run killed in between leaves them to the next: middlewares/items.py).
RECOVERED_TABLE = "_recovered_pages"
# Pages whose items a spider stored while a download of theirs failed (it got no row):
# its next crawl parses them again from the archive, so that the download is tried
# again (middlewares/items.py); a page is deleted from the list once parsed complete.
INCOMPLETE_TABLE = "_incomplete_pages"
META_COLUMNS = ("_key", "_seq", "_spider", "_parsed_at")
# The catalog's own tables (crawler/storage/catalog.py), never an item table; nor is
# any name starting with "_" (this module's tables) or "sqlite_" (SQLite's), nor one
# ending like the index of an item table's natural key (tables and indexes share names).
CATALOG_TABLES = frozenset({"artifacts", "totals", "artifacts_rowid"})
RESERVED_PREFIXES = ("_", "sqlite_")
KEY_INDEX_SUFFIX = "_by_key"
# What an item whose table is reserved is told.
RESERVED_RULE = (
    f"its own tables, names starting with {' or '.join(RESERVED_PREFIXES)}, "
    f"ending with {KEY_INDEX_SUFFIX}"
)
# Fixed width to the microsecond: text order is time order, and two parses of a page
# in the same second still tell which came last.
PARSED_AT_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
PAGES_SQL = f"""
CREATE TABLE IF NOT EXISTS {PAGES_TABLE} (
    _key TEXT NOT NULL,
    _spider TEXT NOT NULL,
    tables TEXT NOT NULL,
    items INTEGER NOT NULL,
    parsed_at TEXT NOT NULL,
    PRIMARY KEY (_key, _spider)
)"""
PAGE_LOG_SQL = f"""
CREATE TABLE IF NOT EXISTS {PAGE_LOG} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    _key TEXT NOT NULL
)"""
RECOVERED_SQL = f"CREATE TABLE IF NOT EXISTS {RECOVERED_TABLE} (_key TEXT PRIMARY KEY)"
INCOMPLETE_SQL = f"""
CREATE TABLE IF NOT EXISTS {INCOMPLETE_TABLE} (
    _key TEXT NOT NULL,
    _spider TEXT NOT NULL,
    PRIMARY KEY (_key, _spider)
)"""


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return bool(
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
    )


def parsed_keys(conn: sqlite3.Connection, spider: str, keys: list[str]) -> set[str]:
    """The ones among ``keys`` whose items of ``spider`` are stored."""
    if not _has_table(conn, PAGES_TABLE):
        return set()
    found: set[str] = set()
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        sql = (
            f"SELECT _key FROM {PAGES_TABLE} WHERE _spider = ? "
            f"AND _key IN ({', '.join('?' * len(chunk))})"
        )
        found.update(k for (k,) in conn.execute(sql, (spider, *chunk)))
    return found


@dataclass
class StoredParsed:
    """Of a batch of keys, the stored ones, and those of them whose items of a spider
    are stored (parsed)."""

    stored: set[str]
    parsed: set[str]


def stored_parsed(conn: sqlite3.Connection, spider: str, keys: list[str]) -> StoredParsed:
    """Which of ``keys`` are stored in the catalog on ``conn``, and which of those have
    their items of ``spider`` stored: one query (a batch of start requests is asked for
    both, and a resumed list of millions is mostly batches). The query returns the keys
    that are not both stored and parsed, the few of a resumed list (see
    ``Catalog.absent_on``)."""
    if not keys:
        return StoredParsed(set(), set())
    sql = (
        "SELECT key, stored FROM (SELECT column1 AS key, "
        "EXISTS (SELECT 1 FROM artifacts WHERE artifacts.key = column1) AS stored, "
        f"EXISTS (SELECT 1 FROM {PAGES_TABLE} WHERE _key = column1 AND _spider = ?) AS parsed "
        f"FROM (VALUES {','.join(['(?)'] * len(keys))})) WHERE NOT (stored AND parsed)"
    )
    try:
        unparsed = conn.execute(sql, (spider, *keys)).fetchall()
    except sqlite3.OperationalError as exc:
        if PAGES_TABLE not in str(exc):
            raise
        # No item stored in this catalog yet: its table is made with the first.
        return StoredParsed(Catalog.present_on(conn, keys), set())
    stored = set(keys) - {key for key, present in unparsed if not present}
    return StoredParsed(stored, stored - {key for key, _ in unparsed})


def parsed_at_now() -> str:
    """The ``_parsed_at`` value of items parsed now (UTC, ISO 8601)."""
    return datetime.now(UTC).strftime(PARSED_AT_FORMAT)


@dataclass
class ItemRow:
    """One item as a table row: plain values, lists and dicts already JSON text."""

    table: str
    values: dict[str, object]
    types: dict[str, str] = field(default_factory=dict)  # declared by field metadata
    natural_key: tuple[str, ...] = ()
    nan_fields: tuple[str, ...] = ()  # a NaN stored as NULL there (the pipeline says so)


# A page's items as they cross to the writer process and are inserted: runs of
# consecutive rows of one shape, (table, field names, declared types, natural key,
# [value tuples]). Tuples pickle several times faster than dataclasses and dicts that
# repeat every field name, and each run is one executemany.
Run = tuple[str, tuple[str, ...], dict[str, str], tuple[str, ...], list[tuple]]


def runs_of(rows: list[ItemRow]) -> list[Run]:
    runs: list[Run] = []
    last = None
    for row in rows:
        shape = (row.table, tuple(row.values), row.types, row.natural_key)
        if shape != last:
            runs.append((*shape, []))
            last = shape
        runs[-1][4].append(tuple(row.values.values()))
    return runs


@dataclass
class PageItems:
    """The items one callback yielded for the page of catalog key ``key``.

    ``replace``: the page was answered from the catalog (or is parsed again), so its
    items replace those stored, whether or not a row of this run goes with them.
    ``incomplete``: a download of its items failed, and the page is to be parsed again.
    ``rows`` on the crawl's side; the writer gets them as ``runs`` (:func:`runs_of`).
    """

    key: str
    spider: str
    rows: list[ItemRow]
    parsed_at: str
    replace: bool = False
    log: bool = False  # a row indexed by a recovery: new to followers too
    incomplete: bool = False
    _runs: list[Run] | None = field(default=None, repr=False, compare=False)

    @property
    def runs(self) -> list[Run]:
        if self._runs is None:
            self._runs = runs_of(self.rows)
        return self._runs

    @property
    def count(self) -> int:
        return sum(len(run[4]) for run in self.runs) if self._runs is not None else len(self.rows)

    def to_wire(self) -> tuple:
        return (
            self.key,
            self.spider,
            self.runs,
            self.parsed_at,
            self.replace,
            self.log,
            self.incomplete,
        )

    @classmethod
    def from_wire(cls, wire: tuple) -> PageItems:
        key, spider, runs, parsed_at, replace, log, incomplete = wire
        return cls(key, spider, [], parsed_at, replace, log, incomplete, runs)

    def __reduce__(self):
        # Pickled (a re-parse worker's pages to its parent) as on the wire: the rows'
        # dataclasses took as long to pickle and load as the parent took to store them.
        return (PageItems.from_wire, (self.to_wire(),))


def reserved_table(name: str) -> bool:
    """Whether ``name`` is one of the catalog database's own tables (SQLite's table
    names ignore case)."""
    folded = name.lower()
    return (
        folded in CATALOG_TABLES
        or folded.startswith(RESERVED_PREFIXES)
        or folded.endswith(KEY_INDEX_SUFFIX)
    )


def item_table_names(conn: sqlite3.Connection, schema: str = "main") -> list[str]:
    """The item tables of a catalog database (of an attached one: ``schema``): those
    not reserved, with the columns every item table has."""
    names = conn.execute(
        f"SELECT name FROM {quote(schema)}.sqlite_master WHERE type = 'table' ORDER BY name"
    ).fetchall()
    found = []
    for (name,) in names:
        if reserved_table(name):
            continue
        columns = conn.execute(f"PRAGMA {quote(schema)}.table_info({quote(name)})").fetchall()
        if set(META_COLUMNS) <= {c[1] for c in columns}:
            found.append(name)
    return found


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class ItemTables:
    """Creates item tables and their columns on demand; replaces a page's items."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self._columns: dict[str, set[str]] = {}
        # INSERT statements by (table, field names), known to have their columns.
        self._shapes: dict[tuple[str, tuple[str, ...]], str] = {}
        self._incomplete_listed = False
        conn.execute(PAGES_SQL)
        conn.execute(PAGE_LOG_SQL)

    def log_pages(self, keys: list[str]) -> None:
        """Append pages whose rows this transaction commits to the page log."""
        self.conn.executemany(f"INSERT INTO {PAGE_LOG} (_key) VALUES (?)", [(k,) for k in keys])

    def columns(self, table: str) -> set[str]:
        known = self._columns.get(table)
        if known is None:
            rows = self.conn.execute(f"PRAGMA table_info({quote(table)})").fetchall()
            known = self._columns[table] = {r[1] for r in rows}
        return known

    def ensure(self, row: ItemRow) -> None:
        """Create ``row.table``, or add the columns it lacks (ALTER TABLE)."""
        known = self.columns(row.table)
        missing = [c for c in row.values if c not in known]
        if known and not missing:
            return
        types = {c: row.types.get(c) or value_type(row.values[c]) for c in row.values}
        if not known:
            pk = row.natural_key or ("_key", "_seq")
            cols = [
                "_key TEXT NOT NULL",
                "_seq INTEGER NOT NULL",
                "_spider TEXT NOT NULL",
                "_parsed_at TEXT NOT NULL",
            ]
            cols += [f"{quote(c)} {types[c]}".rstrip() for c in row.values]
            cols.append(f"PRIMARY KEY ({', '.join(map(quote, pk))})")
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {quote(row.table)} ({', '.join(cols)})")
            if row.natural_key:
                # A page's items are found (and replaced) by _key: the primary key
                # (_key, _seq) serves; a natural key needs its own index, kept on
                # every insert.
                self.conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {quote(row.table + KEY_INDEX_SUFFIX)} "
                    f"ON {quote(row.table)} (_key, _spider)"
                )
            known.update(META_COLUMNS, row.values)
            return
        for column in missing:
            decl = f"{quote(column)} {types[column]}".rstrip()
            try:
                self.conn.execute(f"ALTER TABLE {quote(row.table)} ADD COLUMN {decl}")
            except sqlite3.OperationalError as exc:
                # Another process (a crawl, a re-parse) added it meanwhile.
                if "duplicate column" not in str(exc):
                    raise
            known.add(column)

    @staticmethod
    def _insert_sql(table: str, fields: tuple[str, ...]) -> str:
        names = [*META_COLUMNS, *fields]
        return (
            f"INSERT OR REPLACE INTO {quote(table)} ({', '.join(map(quote, names))}) "
            f"VALUES ({', '.join('?' * len(names))})"
        )

    def replace(self, page: PageItems) -> int:
        return self.replace_many([page])

    def _previous(self, pages: list[PageItems]) -> dict[str, list[tuple[str, str]]]:
        """Table -> (key, spider) of the stored items of ``pages``."""
        by_spider: dict[str, list[str]] = {}
        for page in pages:
            by_spider.setdefault(page.spider, []).append(page.key)
        found: dict[str, list[tuple[str, str]]] = {}
        for spider, keys in by_spider.items():
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                sql = (
                    f"SELECT _key, tables FROM {PAGES_TABLE} WHERE _spider = ? "
                    f"AND _key IN ({', '.join('?' * len(chunk))})"
                )
                for key, tables in self.conn.execute(sql, (spider, *chunk)):
                    for table in json.loads(tables):
                        found.setdefault(table, []).append((key, spider))
        return found

    def replace_many(self, pages: list[PageItems]) -> int:
        """Delete the pages' previous items of their spider, insert their rows: as if
        one page after the other (a page given twice keeps its last items)."""
        latest = {(page.key, page.spider): page for page in pages}
        if len(latest) < len(pages):
            pages = list(latest.values())
        for table, params in self._previous(pages).items():
            if self.columns(table):
                self.conn.executemany(
                    f"DELETE FROM {quote(table)} WHERE _key = ? AND _spider = ?", params
                )
        # Consecutive rows of one shape, over all pages, in one executemany: in order,
        # so that a natural key given twice keeps its last row.
        sql = None
        params: list[tuple] = []
        summaries = []
        n = 0
        for page in pages:
            meta = (page.key, page.spider, page.parsed_at)
            seq = 0
            tables: dict[str, None] = {}
            for run in page.runs:
                table, fields, types, natural, values = run
                shape = (table, fields)
                insert = self._shapes.get(shape)
                if insert is None:
                    self.ensure(
                        ItemRow(table, dict(zip(fields, values[0], strict=True)), types, natural)
                    )
                    insert = self._shapes[shape] = self._insert_sql(*shape)
                if insert is not sql:
                    if params:
                        self.conn.executemany(sql, params)
                        params = []
                    sql = insert
                key, spider, parsed_at = meta
                for i, vals in enumerate(values, seq):
                    params.append((key, i, spider, parsed_at, *vals))
                seq += len(values)
                tables[table] = None
            summaries.append((page.key, page.spider, json.dumps(list(tables)), seq, page.parsed_at))
            n += seq
        if params:
            self.conn.executemany(sql, params)
        self.conn.executemany(
            f"INSERT OR REPLACE INTO {PAGES_TABLE} VALUES (?, ?, ?, ?, ?)", summaries
        )
        self._note_incomplete(pages)
        return n

    def _note_incomplete(self, pages: list[PageItems]) -> None:
        """List the incomplete pages to parse again; the others leave the list."""
        incomplete = [(p.key, p.spider) for p in pages if p.incomplete]
        if incomplete:
            self.conn.execute(INCOMPLETE_SQL)
            self._incomplete_listed = True
            self.conn.executemany(
                f"INSERT OR IGNORE INTO {INCOMPLETE_TABLE} VALUES (?, ?)", incomplete
            )
        if len(incomplete) == len(pages) or not self._lists_incomplete():
            return
        self.conn.executemany(
            f"DELETE FROM {INCOMPLETE_TABLE} WHERE _key = ? AND _spider = ?",
            [(p.key, p.spider) for p in pages if not p.incomplete],
        )

    def _lists_incomplete(self) -> bool:
        # Asked until the list exists: most catalogs never have one.
        if not self._incomplete_listed:
            self._incomplete_listed = _has_table(self.conn, INCOMPLETE_TABLE)
        return self._incomplete_listed


class ItemTableWriter:
    """Replaces pages' items outside a crawl (``scrapy reparse``): one transaction per
    call, so a page has its old items or its new ones."""

    def __init__(self, catalog_path):
        self.catalog = Catalog(catalog_path)
        self.tables = ItemTables(self.catalog.conn)

    def write(self, pages: list[PageItems], then: Callable[[], None] | None = None) -> int:
        """Replace ``pages``' items; ``then`` runs in the same transaction (a follower
        saves its bookmark so, to resume exactly after them)."""
        if not pages and then is None:
            return 0
        with self.catalog.transaction():
            n = self.tables.replace_many(pages) if pages else 0
            if then is not None:
                then()
        return n

    def logged_rows(self, after: int, limit: int) -> list[tuple[int, str]]:
        """(seq, key) of the pages logged after position ``after``, in order."""
        return self.catalog.conn.execute(
            f"SELECT seq, _key FROM {PAGE_LOG} WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()

    def close(self) -> None:
        self.catalog.close()


class PageLogWriter:
    """A store without items (``StoreConfig.items`` off): the pages whose rows each
    batch commits still go to the page log, in that batch's transaction, so that a
    ``reparse --follow`` beside the crawl sees every page."""

    # The rows these keys go with count toward the batch already.
    pending = 0
    create = PAGE_LOG_SQL
    insert = f"INSERT INTO {PAGE_LOG} (_key) VALUES (?)"

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._keys: list[tuple[str]] = []
        self._created = False

    def add(self, key: str) -> None:
        self._keys.append((key,))

    def write(self) -> None:
        if not self._keys:
            return
        if not self._created:
            self._conn.execute(self.create)
            self._created = True
        self._conn.executemany(self.insert, self._keys)
        self._keys.clear()


class RecoveredPagesWriter(PageLogWriter):
    """The recovery of an items crawl: the pages it indexes go to the recovered-pages
    list in the transaction of their rows, to be parsed for their items."""

    create = RECOVERED_SQL
    insert = f"INSERT OR IGNORE INTO {RECOVERED_TABLE} (_key) VALUES (?)"


def incomplete_pages(conn: sqlite3.Connection, spider: str) -> list[tuple[str, str]]:
    """(key, url) of the pages whose items of ``spider`` were stored while a download of
    theirs failed."""
    if not _has_table(conn, INCOMPLETE_TABLE):
        return []
    return conn.execute(
        f"SELECT i._key, a.url FROM {INCOMPLETE_TABLE} i JOIN artifacts a ON a.key = i._key "
        "WHERE i._spider = ?",
        (spider,),
    ).fetchall()


def unparsed_recovered(conn: sqlite3.Connection, spider: str) -> list[tuple[str, str]]:
    """(key, url) of the recovered pages whose items of ``spider`` are not stored."""
    if not _has_table(conn, RECOVERED_TABLE):
        return []
    pages = conn.execute(
        f"SELECT r._key, a.url FROM {RECOVERED_TABLE} r JOIN artifacts a ON a.key = r._key"
    ).fetchall()
    parsed = parsed_keys(conn, spider, [key for key, _ in pages])
    return [(key, url) for key, url in pages if key not in parsed]


class ItemStore:
    """The writer process's side: holds each page's row until its items arrive.

    ``upsert`` queues a row into the catalog's next batch; :meth:`write` runs inside
    that batch's transaction. A page whose row is not held (not stored by this run)
    keeps its items only when they replace a stored page's (``replace``).
    """

    def __init__(self, upsert: Callable[[object], None], conn: sqlite3.Connection):
        self._upsert = upsert
        self._conn = conn
        self._tables: ItemTables | None = None
        self.held: dict[str, object] = {}
        self._ready: list[PageItems] = []
        self._new: list[str] = []  # keys whose rows go in the next batch
        self.items = 0
        self.dropped_pages = 0

    @property
    def pending(self) -> int:
        return len(self._ready) + len(self._new)

    def hold(self, row) -> None:
        self.held[row.key] = row

    def unparsed(self, row) -> None:
        """Queue the row of a response no callback parses: it has no items to wait for,
        and is no page of the page log (a follower would parse it)."""
        self._upsert(row)

    def done(self, page: PageItems) -> None:
        row = self.held.pop(page.key, None)
        if row is None and not page.replace:
            # A response not stored (its status, say): its items have no page.
            if page.count:
                self.dropped_pages += 1
            return
        # Ready before the row is queued: a batch that fills up with it commits both.
        self._ready.append(page)
        if row is not None or page.log:
            self._new.append(page.key)
        if row is not None:
            self._upsert(row)

    def write(self) -> None:
        """Write the ready pages' items (inside the catalog's transaction)."""
        if not self.pending:
            return
        if self._tables is None:
            self._tables = ItemTables(self._conn)
        if self._ready:
            self.items += self._tables.replace_many(self._ready)
        self._tables.log_pages(self._new)
        self._ready.clear()
        self._new.clear()

    def release_held(self) -> int:
        """Queue the rows still held (their callbacks never reported) without items."""
        held, self.held = self.held, {}
        self._new.extend(held)
        for row in held.values():
            self._upsert(row)
        if held:
            logger.warning("%d pages stored without a report of their items", len(held))
        return len(held)
