"""Catalog tools: stats, verify, rebuild, merge, export, CDXJ index, WACZ.

Each tool is a plain class or function over a data directory (``metadata.db`` and
``archive/``); ``commands/catalog.py`` only parses arguments and prints. The archive
is the source of truth: :class:`Rebuild` makes a catalog from it alone, and
:class:`Verify` checks the catalog against it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sqlite3
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from crawler.archive import (
    ArchiveError,
    Indexed,
    index_record,
    is_zip,
    iter_members,
    parse_record,
    payload_digest,
    read_any,
    resolve,
)
from crawler.catalog import COLUMNS, Catalog, Row, repr_col
from crawler.store import index_missing

CATALOG_NAME = "metadata.db"
_GZIP_MAGIC = b"\x1f\x8b\x08"
WACZ_VERSION = "1.1.1"


class ToolError(Exception):
    """A catalog tool cannot do what was asked (the message says what to change)."""


def archive_paths(data_dir: Path, warc_only: bool = False) -> list[Path]:
    """The closed archive files of a data directory, oldest name first."""
    folder = Path(data_dir) / "archive"
    found = list(folder.glob("*.warc.gz"))
    if not warc_only:
        found += folder.glob("*.zip")
    return sorted(found)


def _open_catalog(data_dir: Path) -> Catalog:
    return Catalog(Path(data_dir) / CATALOG_NAME, readonly=True)


# -- scanning archives -----------------------------------------------------------------


@dataclass
class Scan:
    """What the archives hold, and the places they could not be read."""

    indexed: Indexed = field(default_factory=Indexed)
    problems: list[str] = field(default_factory=list)
    records: int = 0


def scan_archives(paths: Iterable[Path], data_dir: Path) -> Scan:
    """Index every readable record; a bad one is reported (file, offset) and skipped."""
    scan = Scan()
    for path in paths:
        relpath = os.path.relpath(path, data_dir)
        if is_zip(path):
            _scan_zip(path, relpath, scan)
        else:
            _scan_warc(path, relpath, scan)
    return scan


def _scan_zip(path: Path, relpath: str, scan: Scan) -> None:
    from crawler.ziparchive import index_meta, iter_entries

    try:
        for entry, meta, body in iter_entries(path):
            index_meta(meta, body, entry, relpath, scan.indexed)
            scan.records += 1
    except ArchiveError as exc:
        scan.problems.append(f"{exc}; the entries after it are not indexed")


def _scan_warc(path: Path, relpath: str, scan: Scan) -> None:
    size = path.stat().st_size
    start = 0
    with open(path, "rb") as f:
        while start < size:
            pos = start
            try:
                for offset, length, raw in iter_members(f, start):
                    pos = offset
                    try:
                        record, _ = parse_record(raw)
                    except (ArchiveError, ValueError) as exc:
                        scan.problems.append(f"{path}: offset {offset}: not a WARC record ({exc})")
                        pos = offset + length
                        continue
                    index_record(record, relpath, offset, length, scan.indexed)
                    scan.records += 1
                    pos = offset + length
                return
            except ArchiveError as exc:
                scan.problems.append(f"{path}: {exc}; skipped to the next record")
                start = _next_member(f, pos + 1)
                if start < 0:
                    return


def _next_member(f, start: int) -> int:
    """Offset of the next gzip header at or after ``start``, or -1."""
    f.seek(start)
    pos, tail = start, b""
    while chunk := f.read(1 << 20):
        buf = tail + chunk
        found = buf.find(_GZIP_MAGIC)
        if found >= 0:
            return pos - len(tail) + found
        tail = buf[-2:]
        pos += len(chunk)
    return -1


def newest_rows(indexed: Indexed) -> dict[str, Row]:
    """The catalog the records imply: the newest fetch of each key, then its 304s."""
    rows: dict[str, Row] = {}
    for row in indexed.rows:
        have = rows.get(row.key)
        if have is None or have.fetched_at < row.fetched_at:
            rows[row.key] = row
    for key, etag, last_modified, fetched_at in sorted(indexed.touches, key=lambda t: t[3]):
        row = rows.get(key)
        if row is not None and row.fetched_at < fetched_at:
            row.etag = etag if etag is not None else row.etag
            row.last_modified = last_modified if last_modified is not None else row.last_modified
            row.fetched_at = fetched_at
    return rows


# -- stats -----------------------------------------------------------------------------


@dataclass
class CatalogStats:
    rows: int
    by_status: list[tuple[int, int]]
    by_content_type: list[tuple[str, int]]
    by_host: list[tuple[str, int]]
    body_bytes: int
    archive_bytes: int
    archive_files: int
    oldest: str | None
    newest: str | None

    @property
    def ratio(self) -> float:
        return self.body_bytes / self.archive_bytes if self.archive_bytes else 0.0

    def lines(self) -> list[str]:
        out = [
            f"rows            {self.rows:>14,}",
            f"bytes stored    {self.body_bytes:>14,}",
            f"archive bytes   {self.archive_bytes:>14,}  in {self.archive_files} files",
            f"compression     {self.ratio:>14.2f}x",
            f"oldest fetch    {self.oldest or '-':>27}",
            f"newest fetch    {self.newest or '-':>27}",
        ]
        for title, pairs in (
            ("status", self.by_status),
            ("content type", self.by_content_type),
            ("host (top 20)", self.by_host),
        ):
            out.append("")
            out.append(f"{title:<40} {'rows':>12}")
            out.extend(f"{str(name):<40} {count:>12,}" for name, count in pairs)
        return out


def catalog_stats(data_dir: Path, top: int = 20) -> CatalogStats:
    with _open_catalog(data_dir) as catalog:
        conn = catalog.conn
        rows, body_bytes, oldest, newest = conn.execute(
            "SELECT count(*), coalesce(sum(bytes), 0), min(fetched_at), max(fetched_at) "
            "FROM artifacts"
        ).fetchone()
        by_status = conn.execute(
            "SELECT status, count(*) FROM artifacts GROUP BY status ORDER BY status"
        ).fetchall()
        types: Counter = Counter()
        for content_type, n in conn.execute(
            "SELECT content_type, count(*) FROM artifacts GROUP BY content_type"
        ):
            types[(content_type or "(none)").split(";")[0].strip().lower()] += n
        hosts: Counter = Counter()
        for (url,) in conn.execute("SELECT url FROM artifacts"):
            hosts[urlsplit(url).hostname or "(none)"] += 1
        archives = [r[0] for r in conn.execute("SELECT DISTINCT archive FROM artifacts")]
    files = {resolve(data_dir, a) for a in archives} | set(archive_paths(data_dir))
    sizes = [p.stat().st_size for p in files if p.exists()]
    return CatalogStats(
        rows=rows,
        by_status=by_status,
        by_content_type=types.most_common(),
        by_host=hosts.most_common(top),
        body_bytes=body_bytes,
        archive_bytes=sum(sizes),
        archive_files=len(sizes),
        oldest=oldest,
        newest=newest,
    )


# -- verify ----------------------------------------------------------------------------


@dataclass
class VerifyReport:
    rows_checked: int = 0
    bad_rows: list[tuple[Row, str]] = field(default_factory=list)
    orphans: list[Row] = field(default_factory=list)
    orphan_touches: list[tuple] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    archive: Indexed = field(default_factory=Indexed)
    dropped: int = 0
    reindexed: int = 0

    @property
    def ok(self) -> bool:
        return not (self.bad_rows or self.orphans or self.orphan_touches or self.problems)

    def lines(self) -> list[str]:
        out = [
            f"{row.archive}: offset {row.offset}: {row.url}: {why}" for row, why in self.bad_rows
        ]
        out += [
            f"{row.archive}: offset {row.offset}: {row.url}: in the archive, not in the catalog"
            for row in self.orphans
        ]
        out += self.problems
        out.append(
            f"checked {self.rows_checked:,} rows: {len(self.bad_rows):,} unreadable or wrong, "
            f"{len(self.orphans):,} stored records missing from the catalog, "
            f"{len(self.orphan_touches):,} 304 refreshes not applied, "
            f"{len(self.problems):,} unreadable places in the archives"
        )
        if self.dropped or self.reindexed:
            out.append(f"fixed: dropped {self.dropped:,} rows, indexed {self.reindexed:,} records")
        elif not self.ok:
            out.append(
                "run `scrapy catalog verify --fix` to drop the bad rows (their URLs are "
                "fetched again) and index the missing records"
            )
        return out


class Verify:
    """Every row's record is readable and its digest matches; nothing stored is
    missing from the catalog."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)

    def check_row(self, row: Row) -> str | None:
        """Why the row's record is not what the row says, or None."""
        try:
            stored = read_any(resolve(self.data_dir, row.archive), row.offset, row.length)
        except (ArchiveError, OSError) as exc:
            return f"unreadable ({exc})"
        if dict(stored.warc_headers).get("X-Crawl-Key") not in (None, row.key):
            return "the record at this offset belongs to another key"
        if row.payload_digest and payload_digest(stored.body) != row.payload_digest:
            return (
                f"digest mismatch (stored {payload_digest(stored.body)}, row {row.payload_digest})"
            )
        if len(stored.body) != row.bytes:
            return f"size mismatch (stored {len(stored.body)}, row {row.bytes})"
        return None

    def run(self) -> VerifyReport:
        report = VerifyReport()
        with _open_catalog(self.data_dir) as catalog:
            have: dict[str, str] = {}
            for row in catalog.rows():
                report.rows_checked += 1
                have[row.key] = row.fetched_at
                why = self.check_row(row)
                if why:
                    report.bad_rows.append((row, why))
        scan = scan_archives(archive_paths(self.data_dir), self.data_dir)
        report.problems = scan.problems
        report.archive = scan.indexed
        implied = newest_rows(Indexed(rows=scan.indexed.rows))
        for key, row in implied.items():
            if key not in have or have[key] < row.fetched_at:
                report.orphans.append(row)
        orphan_keys = {r.key for r in report.orphans}
        for touch in scan.indexed.touches:
            key, fetched_at = touch[0], touch[3]
            if key in have and have[key] < fetched_at and key not in orphan_keys:
                report.orphan_touches.append(touch)
        return report

    def fix(self, report: VerifyReport) -> VerifyReport:
        """Drop the bad rows, then index what the archive holds and the catalog lacks
        (hold the data directory's lock).

        A dropped row whose key has an older readable record falls back to it, as
        ``rebuild`` would; a key with none is fetched again by the next crawl.
        """
        bad = {(row.archive, row.offset) for row, _ in report.bad_rows}
        readable = [r for r in report.archive.rows if (r.archive, r.offset) not in bad]
        with Catalog(self.data_dir / CATALOG_NAME) as catalog:
            catalog.conn.execute("BEGIN IMMEDIATE")
            catalog.conn.executemany(
                "DELETE FROM artifacts WHERE key = ?", [(row.key,) for row, _ in report.bad_rows]
            )
            catalog.conn.execute("COMMIT")
            report.dropped = len(report.bad_rows)
            report.reindexed = index_missing(catalog, readable, report.archive.touches)
        return report


# -- rebuild ---------------------------------------------------------------------------


@dataclass
class RebuildResult:
    path: Path
    rows: int
    records: int
    problems: list[str]


def write_catalog(rows: Iterable[Row], out: Path) -> int:
    """A new catalog at ``out`` (written beside it, then renamed) holding ``rows``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    n = 0
    with Catalog(tmp) as catalog, catalog.writer(batch_size=5000) as batch:
        for row in rows:
            batch.upsert(row)
            n += 1
    _finish_db(tmp, out)
    return n


def _finish_db(tmp: Path, out: Path) -> None:
    conn = sqlite3.connect(tmp)
    conn.execute("PRAGMA journal_mode=DELETE")  # fold the WAL in: one self-contained file
    conn.close()
    os.replace(tmp, out)


class Rebuild:
    """A catalog from the archives alone (the archive is the source of truth)."""

    def __init__(self, data_dir: Path, output: Path | None = None):
        self.data_dir = Path(data_dir)
        self.output = Path(output) if output else self.data_dir / "metadata.rebuilt.db"

    def run(self) -> RebuildResult:
        if self.output.resolve() == (self.data_dir / CATALOG_NAME).resolve():
            raise ToolError(
                f"{self.output} is the live catalog; write elsewhere (-o) and move it in place "
                "with no crawl running"
            )
        scan = scan_archives(archive_paths(self.data_dir), self.data_dir)
        rows = newest_rows(scan.indexed)
        n = write_catalog(sorted(rows.values(), key=lambda r: r.key), self.output)
        return RebuildResult(self.output, n, scan.records, scan.problems)


# -- merge -----------------------------------------------------------------------------


def merge_catalogs(inputs: list[Path], output: Path) -> int:
    """One catalog from several; on a key in several, the newest ``fetched_at`` wins.

    Rows keep their ``archive`` paths (relative to a data directory): gather the
    archives of every input under one ``DATA_DIR/archive`` (their names carry time and
    process id, so they do not clash) and put the merged catalog beside them.
    """
    output = Path(output)
    for path in inputs:
        if Path(path).resolve() == output.resolve():
            raise ToolError(f"{output} is also an input; write the merge to a new file")
        Catalog(path, readonly=True).close()  # exists and has the right schema
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    cols = ", ".join(map(repr_col, COLUMNS))
    updates = ", ".join(f"{repr_col(c)} = excluded.{repr_col(c)}" for c in COLUMNS if c != "key")
    with Catalog(tmp) as catalog:
        conn = catalog.conn
        for path in inputs:
            conn.execute("ATTACH DATABASE ? AS src", (f"file:{path}?mode=ro",))
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                f"INSERT INTO artifacts ({cols}) SELECT {cols} FROM src.artifacts WHERE 1 "
                f"ON CONFLICT(key) DO UPDATE SET {updates} "
                "WHERE excluded.fetched_at > artifacts.fetched_at"
            )
            conn.execute("COMMIT")
            conn.execute("DETACH DATABASE src")
        n = catalog.count()
    _finish_db(tmp, output)
    return n


# -- export ----------------------------------------------------------------------------

EXPORT_FORMATS = ("parquet", "csv")


def _arrow_schema():
    import pyarrow as pa

    types = {
        "status": pa.int32(),
        "bytes": pa.int64(),
        "offset": pa.int64(),
        "length": pa.int64(),
        "rendered": pa.int8(),
    }
    return pa.schema([(c, types.get(c, pa.string())) for c in COLUMNS])


def export_catalog(data_dir: Path, fmt: str, output: Path, batch: int = 50_000) -> int:
    """The catalog as a Parquet or CSV table (written beside ``output``, then renamed)."""
    if fmt not in EXPORT_FORMATS:
        raise ToolError(f"--format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    n = 0
    with _open_catalog(data_dir) as catalog:
        rows = catalog.rows("1 ORDER BY key")
        if fmt == "csv":
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(COLUMNS)
                for row in rows:
                    writer.writerow(astuple(row))
                    n += 1
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = _arrow_schema()
            with pq.ParquetWriter(tmp, schema) as writer:
                for chunk in _chunks(rows, batch):
                    table = pa.Table.from_pylist([row.__dict__ for row in chunk], schema=schema)
                    writer.write_table(table)
                    n += len(chunk)
                if n == 0:
                    writer.write_table(schema.empty_table())
    os.replace(tmp, output)
    return n


def _chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- CDXJ and WACZ ----------------------------------------------------------------------


def write_cdxj(paths: list[Path], out, compress=None, idx_name: str | None = None) -> None:
    """Sorted CDXJ of WARC files, as ``cdxj-indexer --sort`` writes it.

    With ``compress`` (a binary file), the lines go there as gzip blocks and ``out``
    receives the ZipNum ``.idx`` (as in a WACZ).
    """
    from cdxj_indexer.main import CDXJIndexer

    if not paths:
        raise ToolError("no closed WARC files to index under archive/")
    opts = {"sort": True}
    if compress is not None:
        opts.update(compress=compress, data_out_name=idx_name, lines=300)
    CDXJIndexer(out, [str(p) for p in paths], **opts).process_all()


def write_index(data_dir: Path, output: Path) -> int:
    """``index``: a sorted CDXJ of every closed WARC, for pywb and other replay tools."""
    paths = archive_paths(data_dir, warc_only=True)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        write_cdxj(paths, f)
    os.replace(tmp, output)
    with open(output, "rb") as f:
        return sum(1 for _ in f)


class _HashingWriter(io.RawIOBase):
    def __init__(self, dest):
        self.dest = dest
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.dest.write(data)
        self.hash.update(data)
        self.size += len(data)
        return len(data)


class WaczBuilder:
    """Packages the WARCs, a CDXJ index and a pages list as a WACZ, by streaming.

    Every file is copied into the zip (stored, not deflated, as WACZ asks) in 1 MiB
    pieces while its SHA-256 is computed; the index is built in a temporary directory.
    """

    def __init__(self, data_dir: Path, output: Path, title: str | None = None):
        self.data_dir = Path(data_dir)
        self.output = Path(output)
        self.title = title
        self.resources: list[dict] = []

    def _add_stream(self, zf: zipfile.ZipFile, name: str, src) -> None:
        info = zipfile.ZipInfo(name, datetime.now(UTC).timetuple()[:6])
        info.compress_type = zipfile.ZIP_STORED
        with zf.open(info, "w", force_zip64=True) as dest:
            writer = _HashingWriter(dest)
            while chunk := src.read(1 << 20):
                writer.write(chunk)
        self.resources.append(
            {
                "name": os.path.basename(name).lower(),
                "path": name,
                "hash": "sha256:" + writer.hash.hexdigest(),
                "bytes": writer.size,
            }
        )

    def _add_file(self, zf: zipfile.ZipFile, name: str, path: Path) -> None:
        with open(path, "rb") as src:
            self._add_stream(zf, name, src)

    def pages(self, out, warc_names: set[str]) -> int:
        out.write(json.dumps({"format": "json-pages-1.0", "id": "pages", "title": "All Pages"}))
        out.write("\n")
        n = 0
        with _open_catalog(self.data_dir) as catalog:
            for row in catalog.rows(
                "status = 200 AND content_type LIKE 'text/html%' ORDER BY fetched_at"
            ):
                if os.path.basename(row.archive) not in warc_names:
                    continue
                ts = row.fetched_at[:19] + "Z"
                out.write(json.dumps({"id": row.key[:32], "url": row.final_url, "ts": ts}))
                out.write("\n")
                n += 1
        return n

    def run(self) -> Path:
        paths = archive_paths(self.data_dir, warc_only=True)
        if not paths:
            raise ToolError(f"no closed WARC files under {self.data_dir / 'archive'}")
        self.output.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = self.output.with_name(f".{self.output.name}.tmp-{os.getpid()}")
        self.resources = []
        try:
            with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(tmp_out, "w") as zf:
                tmpdir = Path(tmp)
                for path in paths:
                    self._add_file(zf, f"archive/{path.name}", path)
                with (
                    open(tmpdir / "index.idx", "w", encoding="utf-8") as idx,
                    open(tmpdir / "index.cdx.gz", "wb") as data,
                ):
                    write_cdxj(paths, idx, compress=data, idx_name="index.cdx.gz")
                self._add_file(zf, "indexes/index.cdx.gz", tmpdir / "index.cdx.gz")
                self._add_file(zf, "indexes/index.idx", tmpdir / "index.idx")
                with open(tmpdir / "pages.jsonl", "w", encoding="utf-8") as pages:
                    self.pages(pages, {p.name for p in paths})
                self._add_file(zf, "pages/pages.jsonl", tmpdir / "pages.jsonl")
                package = self._datapackage()
                zf.writestr("datapackage.json", package)
                digest = {
                    "path": "datapackage.json",
                    "hash": "sha256:" + hashlib.sha256(package).hexdigest(),
                }
                zf.writestr("datapackage-digest.json", json.dumps(digest, indent=2))
        except BaseException:
            tmp_out.unlink(missing_ok=True)
            raise
        os.replace(tmp_out, self.output)
        return self.output

    def _datapackage(self) -> bytes:
        package = {
            "profile": "data-package",
            "resources": self.resources,
            "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "wacz_version": WACZ_VERSION,
            "software": "research-crawler",
        }
        if self.title:
            package["title"] = self.title
        return json.dumps(package, indent=2).encode("utf-8")


def confirm_prompt(question: str, stream_in=None, stream_out=None) -> bool:
    """Ask a yes/no question on the terminal (no terminal: no)."""
    import sys

    stream_in = stream_in or sys.stdin
    stream_out = stream_out or sys.stderr
    if not stream_in.isatty():
        return False
    stream_out.write(f"{question} [y/N] ")
    stream_out.flush()
    return stream_in.readline().strip().lower() in ("y", "yes")


Confirm = Callable[[str], bool]
