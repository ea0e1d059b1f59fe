"""SQLite databases of bodies (``ARCHIVE_FORMAT=sqlite``): one ``bodies`` table per file.

Each stored answer is a row of ``bodies(id, key, body, headers, meta)``: ``body`` the
payload as served (uncompressed unless ``ARCHIVE_SQLITE_GZIP_LEVEL`` is set, so that
``WHERE body LIKE ...`` searches it; UTF-8 text is a TEXT value, other bytes a BLOB),
``headers`` the HTTP response headers as a JSON
list of pairs, ``meta`` what a WARC record's headers would say (type, URLs, method,
status, fetch time, payload digest, encoding) as a JSON object. A catalog row names the
file, ``offset`` is the body's ``id`` and ``length`` the size of the stored ``body``:
``SELECT body FROM bodies WHERE id = :offset`` reads it with nothing but SQLite. A 304
revalidation is a row of type ``revisit`` with no body.

One writer per file, in WAL mode with ``synchronous=FULL``: the writer commits its
open transaction in :meth:`SqliteWriter.flush`, the store's ``before_commit`` hook, so
a body is committed (and fsynced) before the catalog row that names it, as a WARC
record is flushed and fsynced. A kill loses only bodies whose rows were not committed
either. Files roll over and carry a ``.writing`` marker like the other formats, so
that shipping, merging and recovery treat them alike; a closed file is switched back
to a rollback journal and is one self-contained database.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import zlib
from collections.abc import Iterator
from pathlib import Path

from crawler import settingspecs
from crawler.storage.catalog import readonly_uri
from crawler.storage.errors import ArchiveError, SettingError
from crawler.storage.formats.base import (
    ArchiveFormat,
    ArchiveWriter,
    Repair,
    Scan,
    closed_name,
    finish_repair,
    fsync_dir,
    writing_marker,
)
from crawler.storage.records import (
    DOWNLOAD_META,
    KEY_HEADER,
    METHOD_HEADER,
    REQUESTED_URI_HEADER,
    Fetch,
    Indexed,
    Row,
    StoredRecord,
    fetch_row,
    header,
    meta_row,
    payload_digest,
    payload_headers,
    refers_to,
    revisit_row,
    warc_date,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS bodies (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    body BLOB,
    headers TEXT NOT NULL,
    meta TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS bodies_key ON bodies (key);
"""
_INSERT = "INSERT INTO bodies (key, body, headers, meta) VALUES (?, ?, ?, ?)"
_SELECT = "SELECT id, key, body, headers, meta FROM bodies"


class SqliteArchiveError(ArchiveError):
    """A bodies database or one of its rows cannot be read back."""


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))


class SqliteWriter(ArchiveWriter):
    """Inserts bodies into rolling ``.sqlite`` databases, one transaction per catalog
    batch."""

    suffix = ".sqlite"

    def __init__(
        self,
        directory: str | os.PathLike,
        data_dir: str | os.PathLike,
        prefix: str = "crawl",
        rollover_bytes: int = 1_000_000_000,
        rollover_seconds: float = 0.0,
        gzip_level: int = 0,
    ):
        super().__init__(directory, data_dir, prefix, rollover_bytes, rollover_seconds)
        self.level = gzip_level
        self._db: sqlite3.Connection | None = None
        self._in_transaction = False

    def _started(self) -> None:
        # RollingFile made the (empty) file under its marker: SQLite takes it as a new
        # database.
        self._file.close()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._file = self._db  # what RollingFile asks is whether a file is open

    def _insert(self, key: str, body: bytes | None, headers, meta: dict) -> int:
        if self._db is None:
            self._open()
        if not self._in_transaction:
            self._db.execute("BEGIN")
            self._in_transaction = True
        headers_json, meta_json = _json(headers), _json(meta)
        cursor = self._db.execute(_INSERT, (key, body, headers_json, meta_json))
        self.size += len(body or b"") + len(headers_json) + len(meta_json)
        self.records_written += 1
        return cursor.lastrowid

    def write_fetch(self, fetch: Fetch, digest: str | None = None) -> Row:
        digest = digest or payload_digest(fetch.body)
        body = fetch.body
        meta = {
            "type": "response",
            "url": fetch.url,
            "final_url": fetch.final_url,
            "method": fetch.method,
            "status": fetch.status,
            "fetched_at": warc_date(fetch.fetched_at),
            "digest": digest,
        }
        if not fetch.parsed:
            meta[DOWNLOAD_META] = 1
        if self.level > 0:
            body = zlib.compress(body, self.level, 31)  # a gzip member: any tool reads it
            meta["encoding"] = "gzip"
        headers = payload_headers(fetch.response_headers, len(fetch.body))
        row_id = self._insert(fetch.key, _as_text(body), headers, meta)
        return fetch_row(fetch, self.relpath, row_id, len(body), digest)

    def write_revisit(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        meta = {
            "type": "revisit",
            "url": fetch.url,
            "final_url": fetch.final_url,
            "method": fetch.method,
            "status": fetch.status,
            "fetched_at": warc_date(fetch.fetched_at),
            "refers_to_date": refers_to_date,
        }
        self._insert(fetch.key, None, payload_headers(fetch.response_headers, 0), meta)

    def write_unchanged(self, fetch: Fetch, original: Row) -> Row:
        """A ``revisit`` row with no body whose meta names the payload's digest and the
        record holding it (its key, URL and date); the catalog row points at that one."""
        meta = {
            "type": "revisit",
            "profile": "identical-payload-digest",
            "url": fetch.url,
            "final_url": fetch.final_url,
            "method": fetch.method,
            "status": fetch.status,
            "fetched_at": warc_date(fetch.fetched_at),
            "digest": original.payload_digest,
            "refers_to": refers_to(original),
            "refers_to_uri": original.final_url,
            "refers_to_date": original.fetched_at,
        }
        if not fetch.parsed:
            meta[DOWNLOAD_META] = 1
        headers = payload_headers(fetch.response_headers, len(fetch.body))
        self._insert(fetch.key, None, headers, meta)
        return fetch_row(
            fetch, original.archive, original.offset, original.length, original.payload_digest
        )

    def flush(self, fsync: bool = True) -> None:
        """Commit the bodies inserted since the last flush (fsynced: synchronous=FULL)."""
        if self._db is not None and self._in_transaction:
            self._db.execute("COMMIT")
            self._in_transaction = False

    def close(self) -> Path | None:
        if self._db is None:
            return None
        self.flush()
        _finish(self._db)
        self._db = self._file = None
        _fsync(self.path)
        writing_marker(self.path).unlink()
        fsync_dir(self.directory)
        self.closed_files.append(self.path)
        return self.path

    def abandon(self) -> None:
        """As a kill leaves it: what is not committed is lost, the marker stays."""
        if self._db is not None:
            self._db.close()  # an open transaction is rolled back
            self._db = self._file = None
            self._in_transaction = False


def _as_text(body: bytes) -> str | bytes:
    """UTF-8 text as a TEXT value (the same bytes), so that ``body LIKE '%...%'`` finds
    it: SQLite's LIKE does not match inside a BLOB. Anything else stays a BLOB (a NUL
    byte would end the text for LIKE and the shell)."""
    if b"\0" in body:
        return body
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body


def _finish(db: sqlite3.Connection) -> None:
    """Fold the WAL into the database and go back to a rollback journal, so that the
    closed file is one database a reader on read-only storage can open; a reader that
    holds it open leaves it in WAL mode, which is still a whole database once closed."""
    with contextlib.suppress(sqlite3.OperationalError):
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    db.close()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------


@contextlib.contextmanager
def connect(path: str | os.PathLike) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a bodies database (an error names the file)."""
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", str(path))
    try:
        db = sqlite3.connect(readonly_uri(path), uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise SqliteArchiveError(f"{path}: cannot open the bodies database ({exc})") from exc
    try:
        yield db
    except sqlite3.Error as exc:
        raise SqliteArchiveError(f"{path}: not a readable bodies database ({exc})") from exc
    finally:
        db.close()


def _stored_bytes(body: str | bytes | None) -> bytes:
    """A body as stored, in bytes (text is stored as its UTF-8)."""
    if body is None:
        return b""
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _body(body: str | bytes | None, meta: dict, where: str) -> bytes:
    body = _stored_bytes(body)
    if meta.get("encoding") == "gzip":
        try:
            return zlib.decompress(body, 31)
        except zlib.error as exc:
            raise SqliteArchiveError(f"{where}: corrupt gzip body ({exc})") from exc
    return body


def stored_record(path, row: tuple) -> StoredRecord:
    """The stored answer a ``bodies`` row holds (``id, key, body, headers, meta``)."""
    row_id, key, body, headers_json, meta_json = row
    where = f"{path}: id {row_id}"
    try:
        meta, headers = json.loads(meta_json), json.loads(headers_json)
    except ValueError as exc:
        raise SqliteArchiveError(f"{where}: headers or meta are not JSON ({exc})") from exc
    warc_headers = [
        ("WARC-Type", meta["type"]),
        ("WARC-Target-URI", meta["final_url"]),
        ("WARC-Date", meta["fetched_at"]),
        (KEY_HEADER, key),
        (REQUESTED_URI_HEADER, meta["url"]),
        (METHOD_HEADER, meta["method"]),
    ]
    if meta.get("digest"):
        warc_headers.append(("WARC-Payload-Digest", meta["digest"]))
    return StoredRecord(
        url=meta["final_url"],
        status=int(meta["status"]),
        headers=[tuple(h) for h in headers],
        body=_body(body, meta, where),
        warc_headers=warc_headers,
    )


def index_row(row: tuple, relpath: str, out: Indexed) -> None:
    """Add what one ``bodies`` row says about the catalog to ``out``."""
    row_id, key, body, headers_json, meta_json = row
    meta, headers = json.loads(meta_json), json.loads(headers_json)
    download = bool(meta.get(DOWNLOAD_META))
    if meta["type"] == "revisit" and meta.get("refers_to"):
        out.add(revisit_row({**meta, "key": key}, headers), download)
        return
    if meta["type"] == "revisit":
        etag, last_modified = header(headers, "ETag"), header(headers, "Last-Modified")
        out.touches.append((key, etag, last_modified, meta["fetched_at"]))
        return
    row = meta_row({**meta, "key": key}, headers, relpath, row_id, len(_stored_bytes(body)))
    out.add(row, download)


def _index(path: Path, relpath: str, out: Indexed) -> int:
    with connect(path) as db:
        rows = db.execute(f"{_SELECT} ORDER BY id").fetchall()
    for row in rows:
        try:
            index_row(row, relpath, out)
        except (ValueError, KeyError) as exc:
            raise SqliteArchiveError(f"{path}: id {row[0]}: bad headers or meta ({exc})") from exc
    return len(rows)


class SqliteFormat(ArchiveFormat):
    name = "sqlite"
    suffix = SqliteWriter.suffix
    what = "body"

    def options(self, settings) -> dict:
        name = "ARCHIVE_SQLITE_GZIP_LEVEL"  # 0: bodies searchable with LIKE
        try:
            return {"sqlite_gzip_level": settingspecs.check_value(name, settings.get(name) or 0)}
        except settingspecs.SettingValueError as exc:
            raise SettingError(str(exc)) from None

    def writer(
        self,
        directory,
        data_dir,
        *,
        gzip_level: int,
        compressor: str,
        sqlite_gzip_level: int = 0,
        **options,
    ):
        # ARCHIVE_GZIP_LEVEL is the WARC writer's: bodies stay searchable unless
        # ARCHIVE_SQLITE_GZIP_LEVEL asks for compression.
        return SqliteWriter(directory, data_dir, gzip_level=sqlite_gzip_level, **options)

    def decode(self, data: bytes, path, offset: int) -> StoredRecord:
        raise SqliteArchiveError(f"{path}: id {offset}: a body is read by its id, not bytes")

    def read(self, path, offset: int, length: int) -> StoredRecord:
        with connect(path) as db:
            row = db.execute(f"{_SELECT} WHERE id = ?", (offset,)).fetchone()
        if row is None:
            raise SqliteArchiveError(f"{path}: id {offset}: no such body")
        return stored_record(path, row)

    def read_span(self, path, spans: list[tuple[int, int]]) -> list:
        try:
            with connect(path) as db:
                rows = db.execute(
                    f"{_SELECT} WHERE id BETWEEN ? AND ?", (spans[0][0], spans[-1][0])
                ).fetchall()
        except ArchiveError as exc:
            return [exc] * len(spans)
        by_id = {row[0]: row for row in rows}
        out: list = []
        for offset, _length in spans:
            try:
                row = by_id.get(offset)
                if row is None:
                    raise SqliteArchiveError(f"{path}: id {offset}: no such body")
                out.append(stored_record(path, row))
            except ArchiveError as exc:
                out.append(exc)
        return out

    def iter_span(self, path, spans: list[tuple[int, int]]) -> Iterator:
        # Bodies come from one query; they are already whole when it returns.
        return iter(self.read_span(path, spans))

    def index(self, path: Path, data_dir: Path, relpath: str | None = None) -> Indexed:
        out = Indexed()
        _index(path, relpath or os.path.relpath(path, data_dir), out)
        return out

    def holds(self, path, end: int, last_offset: int) -> bool:
        # A row's offset is the id of its body: the file must hold that id.
        try:
            with connect(path) as db:
                (last,) = db.execute("SELECT max(id) FROM bodies").fetchone()
        except (OSError, sqlite3.Error, ArchiveError):
            return False
        return last is not None and last >= last_offset

    def scan(self, path: Path, relpath: str, scan: Scan) -> None:
        try:
            scan.records += _index(path, relpath, scan.indexed)
        except ArchiveError as exc:
            scan.problems.append(f"{exc}; its bodies are not indexed")

    def repair(self, path: Path, data_dir: Path) -> Repair:
        """Opening the database rolls back what a killed writer left uncommitted; the
        WAL is folded in and the file marked closed. Nothing is cut: SQLite keeps only
        whole transactions."""
        closed = closed_name(path)
        try:
            db = sqlite3.connect(path, isolation_level=None, timeout=30)
            db.executescript(SCHEMA)  # a file killed before its schema was committed
            _finish(db)
        except sqlite3.Error as exc:
            raise SqliteArchiveError(f"{path}: cannot repair the bodies database ({exc})") from exc
        _fsync(path)
        indexed = self.index(path, data_dir, os.path.relpath(closed, data_dir))
        finish_repair(path, closed)
        return Repair(closed, len(indexed.rows) + len(indexed.touches), 0, None, indexed)


FORMAT = SqliteFormat()
