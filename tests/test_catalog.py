from __future__ import annotations

import contextlib
import sqlite3

import pytest

from crawler.storage.catalog import SCHEMA_VERSION, Catalog, CatalogError, Row
from crawler.storage.keys import canonical_url, request_key


def row(key: str, fetched_at: str = "2026-01-01T00:00:00.000000Z", **kw) -> Row:
    base = dict(
        key=key,
        url=f"http://example.org/{key}",
        final_url=f"http://example.org/{key}",
        status=200,
        content_type="text/html",
        bytes=10,
        etag='"e1"',
        last_modified="Tue, 14 Nov 2023 22:13:20 GMT",
        fetched_at=fetched_at,
        archive="archive/a.warc.gz",
        offset=0,
        length=100,
        payload_digest="sha1:X",
    )
    base.update(kw)
    return Row(**base)


def test_pragmas_and_schema(tmp_path):
    with Catalog(tmp_path / "metadata.db") as catalog:
        conn = catalog.conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA cache_size").fetchone()[0] == -65536
        assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
        assert catalog.version == SCHEMA_VERSION
        columns = {r[1] for r in conn.execute("PRAGMA table_info(artifacts)")}
    assert columns >= {
        "key", "url", "final_url", "status", "content_type", "bytes", "etag",
        "last_modified", "fetched_at", "archive", "offset", "length", "payload_digest",
    }  # fmt: skip


def test_the_busy_timeout_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CATALOG_BUSY_TIMEOUT", "2.5")
    with Catalog(tmp_path / "metadata.db") as catalog:
        assert catalog.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    with Catalog(tmp_path / "metadata.db", readonly=True) as catalog:
        assert catalog.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("CATALOG_BUSY_TIMEOUT", bad)
        with pytest.raises(CatalogError, match=r"CATALOG_BUSY_TIMEOUT=.*seconds >= 0"):
            Catalog(tmp_path / "metadata.db")
    assert (tmp_path / "metadata.db").exists()


def test_a_reader_never_sees_a_catalog_being_created(tmp_path):
    path = tmp_path / "metadata.db"
    seen = []

    class Watched(Catalog):
        def migrate(self):
            # What a reader opening the catalog mid-creation would get.
            if seen:
                return super().migrate()
            try:
                Catalog(path, readonly=True).close()
                seen.append("opened")
            except CatalogError as exc:
                seen.append(str(exc))
            super().migrate()

    Watched(path).close()
    assert len(seen) == 1 and "no catalog here" in seen[0]
    with Catalog(path, readonly=True) as catalog:
        assert catalog.version == SCHEMA_VERSION
        assert catalog.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name]


def test_a_newer_schema_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "metadata.db"
    Catalog(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(CatalogError, match="newer than this code knows"):
        Catalog(path)
    with pytest.raises(CatalogError, match="newer"):
        Catalog(path, readonly=True)


def test_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "metadata.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CatalogError, match="not a usable SQLite catalog"):
        Catalog(path)


def test_another_programs_sqlite_file_is_a_clear_error_to_a_reader(tmp_path):
    path = tmp_path / "metadata.db"
    with contextlib.closing(sqlite3.connect(path)) as other:
        other.execute("CREATE TABLE artifacts (name TEXT)")  # a name in common, nothing else
    with pytest.raises(CatalogError, match="not a catalog of this project"):
        Catalog(path, readonly=True)


def test_batches_commit_per_batch_size(tmp_path):
    path = tmp_path / "metadata.db"
    commits = []
    with Catalog(path) as catalog, Catalog(path, readonly=True) as reader:
        with catalog.writer(
            batch_size=3, before_commit=lambda: commits.append(reader.count())
        ) as batch:
            for i in range(7):
                batch.upsert(row(f"k{i}"))
                # a reader sees whole batches only
                assert reader.count() == 3 * ((i + 1) // 3)
        assert reader.count() == 7
    assert commits == [0, 3, 6]


def test_a_batch_is_flushed_when_its_time_is_up(tmp_path):
    with Catalog(tmp_path / "metadata.db") as catalog:
        batch = catalog.writer(batch_size=1000, flush_seconds=0.0)
        batch.upsert(row("k1"))
        assert catalog.count() == 1


def test_upsert_replaces_and_touch_only_refreshes(tmp_path):
    with Catalog(tmp_path / "metadata.db") as catalog:
        with catalog.writer() as batch:
            batch.upsert(row("k", bytes=10))
            batch.upsert(row("k", bytes=20, offset=500))
        got = catalog.get("k")
        assert (got.bytes, got.offset) == (20, 500)
        with catalog.writer() as batch:
            batch.touch("k", '"e2"', None, "2026-02-01T00:00:00.000000Z")
        after = catalog.get("k")
        assert after.etag == '"e2"'
        assert after.last_modified == got.last_modified  # kept when the 304 has none
        assert after.fetched_at == "2026-02-01T00:00:00.000000Z"
        assert (after.bytes, after.offset, after.archive) == (20, 500, got.archive)
        assert catalog.count() == 1


def test_present_looks_up_a_batch_of_keys(tmp_path):
    with Catalog(tmp_path / "metadata.db") as catalog:
        with catalog.writer() as batch:
            for i in range(10):
                batch.upsert(row(f"k{i}"))
        assert catalog.present([f"k{i}" for i in range(5, 15)]) == {f"k{i}" for i in range(5, 10)}
        assert catalog.present([]) == set()


def test_key_rule():
    a = request_key("HTTP://Example.ORG:80/a?b=2&a=1#frag")
    assert a == request_key("http://example.org/a?a=1&b=2")
    assert canonical_url("http://Example.org/a?b=2&a=1#x") == "http://example.org/a?a=1&b=2"
    import hashlib

    assert a == hashlib.sha256(b"http://example.org/a?a=1&b=2").hexdigest()
    post = request_key("http://example.org/a", "POST", b"q=1")
    assert post == hashlib.sha256(b"POST http://example.org/a\nq=1").hexdigest()
    assert post != request_key("http://example.org/a", "POST", b"q=2")
    assert len(a) == 64 and a == a.lower()


def scanned(catalog: Catalog) -> dict:
    by_status = dict(
        catalog.conn.execute(
            "SELECT status, count(*) FROM artifacts GROUP BY status ORDER BY status"
        )
    )
    rows, total = catalog.conn.execute(
        "SELECT count(*), coalesce(sum(bytes), 0) FROM artifacts"
    ).fetchone()
    return {"rows": rows, "bytes": total, "by_status": by_status}


def test_the_summary_follows_every_write_without_a_scan(tmp_path):
    with Catalog(tmp_path / "metadata.db") as catalog:
        assert catalog.summary() == {"rows": 0, "bytes": 0, "by_status": {}}
        with catalog.writer() as batch:
            for i in range(6):
                batch.upsert(row(f"k{i}", bytes=10 + i))
            batch.upsert(row("k0", status=404, bytes=3))  # refetched: another answer
            batch.upsert(row("k1", bytes=100))  # same status, new body
            batch.touch("k2", '"e9"', None, "2026-03-01T00:00:00.000000Z")
        catalog.conn.execute("DELETE FROM artifacts WHERE key = 'k3'")
        assert catalog.summary() == scanned(catalog)
        assert catalog.summary()["by_status"] == {200: 4, 404: 1}
        assert catalog.summary()["bytes"] == 3 + 100 + 12 + 14 + 15


def test_an_older_catalog_gets_its_totals_when_migrated(tmp_path):
    from crawler.storage.catalog import MIGRATIONS, statements

    path = tmp_path / "metadata.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version in (1, 2):
        for stmt in statements(MIGRATIONS[version]):
            conn.execute(stmt)
    conn.execute("PRAGMA user_version = 2")
    for i, status in enumerate([200, 200, 404, 301]):
        conn.execute(
            "INSERT INTO artifacts VALUES (?, 'u', 'u', ?, NULL, ?, NULL, NULL, 't', 'a', 0, 9, NULL, 'GET', 0)",
            (f"k{i}", status, 10 * (i + 1)),
        )
    conn.close()
    with Catalog(path, readonly=True) as catalog:  # read as it is, not migrated
        assert catalog.version == 2
        assert catalog.get("k2").status == 404
        assert catalog.summary() == {"rows": 4, "bytes": 100, "by_status": {200: 2, 301: 1, 404: 1}}
    with Catalog(path) as catalog:
        assert catalog.version == SCHEMA_VERSION
        assert catalog.summary() == {"rows": 4, "bytes": 100, "by_status": {200: 2, 301: 1, 404: 1}}
        with catalog.writer() as batch:
            batch.upsert(row("k9", status=410, bytes=1))
        assert catalog.summary() == scanned(catalog)


def test_a_version_3_catalog_becomes_a_rowid_table_with_its_rows_and_totals(tmp_path):
    from crawler.storage.catalog import MIGRATIONS, statements

    path = tmp_path / "metadata.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version in (1, 2, 3):
        for stmt in statements(MIGRATIONS[version]):
            conn.execute(stmt)
    conn.execute("PRAGMA user_version = 3")
    rows = [row(f"k{i}", status=status, bytes=i) for i, status in enumerate([200, 404, 200])]
    marks = ", ".join("?" * 15)
    for r in rows:
        conn.execute(f"INSERT INTO artifacts VALUES ({marks})", tuple(vars(r).values()))
    conn.close()
    with Catalog(path) as catalog:
        assert catalog.version == SCHEMA_VERSION
        sql = catalog.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'artifacts'")
        assert "WITHOUT ROWID" not in sql.fetchone()[0]
        assert [catalog.get(r.key) for r in rows] == rows
        assert catalog.conn.execute("SELECT count(rowid) FROM artifacts").fetchone() == (3,)
        with catalog.writer() as batch:
            batch.upsert(row("k1", status=410, bytes=7))  # the key stays unique
        assert catalog.count() == 3
        assert catalog.summary() == scanned(catalog)
        assert catalog.summary()["by_status"] == {200: 2, 410: 1}


def catalog_of_version(path, version: int, rows: list[Row]) -> None:
    """A catalog as the code of schema ``version`` made it, holding ``rows`` (the
    columns that schema has)."""
    from crawler.storage.catalog import MIGRATIONS, statements

    conn = sqlite3.connect(path, isolation_level=None)
    for number in range(1, version + 1):
        for stmt in statements(MIGRATIONS[number]):
            conn.execute(stmt)
    conn.execute(f"PRAGMA user_version = {version}")
    columns = [r[1] for r in conn.execute("PRAGMA table_info(artifacts)")]
    names = ", ".join(f'"{c}"' for c in columns)
    for r in rows:
        values = [getattr(r, c) for c in columns]
        conn.execute(
            f"INSERT INTO artifacts ({names}) VALUES ({', '.join('?' * len(columns))})", values
        )
    conn.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_every_older_schema_reads_merges_and_counts_as_seen(tmp_path, version):
    from crawler.storage.seen import SeenCatalogs

    # The archive file its rows name, so that CATALOG_SEEN counts them.
    (tmp_path / "old" / "archive").mkdir(parents=True)
    (tmp_path / "old" / "archive" / "a.warc.gz").write_bytes(b"")
    old = tmp_path / "old" / "metadata.db"
    rows = [row("k1"), row("k2", status=404, method="POST")]
    catalog_of_version(old, version, rows)
    expected = rows  # v1 lacks "rendered", which reads as its default (0)
    with Catalog(old, readonly=True) as catalog:  # read as it is, not migrated
        assert catalog.version == version
        assert catalog.get("k2") == expected[1]
        assert list(catalog.rows("1 ORDER BY key")) == expected
        assert catalog.summary()["by_status"] == {200: 1, 404: 1}
    with Catalog(tmp_path / "new.db") as merged:
        merged.merge_from(old)
        assert [merged.get(r.key) for r in rows] == expected
    seen = SeenCatalogs([str(old)], tmp_dir=str(tmp_path))
    try:
        assert seen.present(["k1", "k2", "k3"]) == {"k1", "k2"}
        assert seen.get("k1").status == 200 and seen.get("k1").rendered == 0
    finally:
        seen.close()


def test_a_clean_close_leaves_no_wal_behind_while_a_reader_has_the_catalog_open(tmp_path):
    path = tmp_path / "metadata.db"
    wal = tmp_path / "metadata.db-wal"
    # A reader outside the project keeps the database open (the last connection to close
    # would checkpoint and delete the WAL by itself and hide a close that does not).
    catalog = Catalog(path)
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert reader.execute("SELECT count(*) FROM artifacts").fetchone() == (0,)
        with catalog.writer(batch_size=10) as batch:
            for i in range(500):
                batch.upsert(row(f"k{i}"))
        assert wal.stat().st_size > 0  # committed, not yet moved into the database
        catalog.close()
        assert not wal.exists() or wal.stat().st_size == 0, f"{wal}: {wal.stat().st_size} bytes"
        copy = tmp_path / "copy.db"
        copy.write_bytes(path.read_bytes())  # the database file alone holds every row
        with sqlite3.connect(copy) as alone:
            assert alone.execute("SELECT count(*) FROM artifacts").fetchone() == (500,)
    finally:
        reader.close()


class FailingWrites:
    """Writes a batch commits with its rows (as item tables are), failing on demand."""

    pending = 0
    fail = True

    def write(self) -> None:
        if self.fail:
            raise sqlite3.OperationalError("database or disk is full")


def test_a_batch_that_fails_commits_none_of_it_and_the_next_batch_commits(tmp_path):
    path = tmp_path / "metadata.db"
    writes = FailingWrites()
    with Catalog(path) as catalog:
        batch = catalog.writer(batch_size=100)
        batch.add_writes(writes)
        batch.upsert(row("k1"))
        with pytest.raises(sqlite3.OperationalError):
            batch.flush()
        assert not catalog.conn.in_transaction, "the failed transaction was left open"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as reader:
            assert reader.execute("SELECT count(*) FROM artifacts").fetchone() == (0,)
        writes.fail = False
        batch.upsert(row("k2"))
        assert batch.flush() == 2  # the failed batch's row goes with the next
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as reader:
        assert reader.execute("SELECT count(*) FROM artifacts").fetchone() == (2,)


def test_a_start_batch_lookup_tells_stored_parsed_and_seen_apart(tmp_path):
    # What a resumed list's batch is asked: stored here or in a CATALOG_SEEN catalog,
    # and parsed for this spider (pages with items of another spider are not).
    from crawler.storage.batchlookup import BatchLookup
    from crawler.storage.items import PAGES_SQL, PAGES_TABLE
    from crawler.storage.seen import CatalogWithSeen, SeenCatalogs

    (tmp_path / "old" / "archive").mkdir(parents=True)
    (tmp_path / "old" / "archive" / "a.warc.gz").write_bytes(b"")
    with Catalog(tmp_path / "old" / "metadata.db") as old, old.writer() as batch:
        for key in ("s0", "s1", "k3"):
            batch.upsert(row(key))
    seen = SeenCatalogs([str(tmp_path / "old" / "metadata.db")], tmp_dir=str(tmp_path))
    catalog = Catalog(tmp_path / "metadata.db")
    with catalog.writer() as batch:
        for i in range(10):
            batch.upsert(row(f"k{i}"))
    lookup = BatchLookup(CatalogWithSeen(catalog, seen))
    keys = [f"k{i}" for i in range(10)] + ["x1", "s0", "s1", "k0", "x2"]
    try:
        stored = {f"k{i}" for i in range(10)} | {"s0", "s1"}
        found = lookup.stored_parsed(keys, None)
        assert (found.stored, found.parsed) == (stored, stored)
        found = lookup.stored_parsed(keys, "shop")  # no item stored yet: no pages table
        assert (found.stored, found.parsed) == (stored, set())
        with catalog.conn:
            catalog.conn.execute(PAGES_SQL)
            catalog.conn.executemany(
                f"INSERT INTO {PAGES_TABLE} VALUES (?, ?, '[]', 1, '')",
                [(f"k{i}", "shop") for i in range(4)] + [("k5", "other"), ("x1", "shop")],
            )
        found = lookup.stored_parsed(keys, "shop")
        assert found.stored == stored
        assert found.parsed == {"k0", "k1", "k2", "k3"}  # x1: parsed, not stored
        assert lookup.stored_parsed([], "shop").stored == set()
    finally:
        lookup.close()
        catalog.close()
        seen.close()
