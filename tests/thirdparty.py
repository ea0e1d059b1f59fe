"""A data directory read as a program outside the project reads it: the sqlite3 module
for the catalog; for each row, a seek and read of the file the row names, then gzip and
warcio (WARC) or the entry's local header (zip), or the ``sqlite3`` command-line shell's
``SELECT`` of the body a row names (sqlite). None of the project's code, so that a
fault in its readers cannot hide one in what it wrote."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sqlite3
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from warcio.archiveiterator import ArchiveIterator

COLUMNS = 'key, url, final_url, status, bytes, archive, "offset", length'


def catalog_rows(data_dir: Path) -> list[tuple]:
    """Every row of ``artifacts`` (``COLUMNS``), or none before the catalog exists."""
    path = data_dir / "metadata.db"
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        try:
            return db.execute(f"SELECT {COLUMNS} FROM artifacts").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # created, its schema not yet committed
                return []
            raise


def warc_body(raw: bytes) -> bytes:
    """The payload of the one gzip member ``raw``, a WARC response record."""
    record = next(iter(ArchiveIterator(io.BytesIO(gzip.decompress(raw)))))
    assert record.rec_type == "response", record.rec_type
    return record.content_stream().read()


def zip_body(raw: bytes) -> bytes:
    """The data of the zip entry ``raw`` starts with: a local file header (PKWARE
    APPNOTE 4.3.7), then the entry, stored or deflated."""
    sig, _, _, method, _, _, crc, csize, _, name_len, extra_len = struct.unpack(
        "<4sHHHHHIIIHH", raw[:30]
    )
    assert sig == b"PK\x03\x04", sig
    start = 30 + name_len + extra_len
    data = raw[start : start + csize]
    body = zlib.decompress(data, -15) if method == 8 else data
    assert zlib.crc32(body) == crc, "the entry's CRC does not match"
    return body


def reader(archive: str) -> Callable[[bytes], bytes]:
    if archive.endswith(".warc.gz"):
        return warc_body
    if archive.endswith(".zip"):
        return zip_body
    raise AssertionError(f"{archive}: a row names a file of no known format")


def sqlite_body(path: Path, row_id: int) -> tuple[int, bytes]:
    """The stored size and the body of row ``row_id`` of the ``bodies`` table, as the
    ``sqlite3`` shell reads them (hex, so that any bytes survive its text output)."""
    sql = (
        "SELECT length(CAST(body AS BLOB)) || '|' || hex(body) || '|' "
        "|| coalesce(json_extract(meta, '$.encoding'), '') "
        f"FROM bodies WHERE id = {int(row_id)}"
    )
    out = subprocess.run(
        # A busy timeout, as any reader of a live database sets: closing a file takes
        # it out of WAL mode, which locks it for a moment.
        ["sqlite3", "-readonly", "-bail", "-cmd", ".timeout 30000", str(path), sql],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"sqlite3 {path}: {out.stderr.strip()}"
    assert out.stdout.strip(), f"{path}: no body of id {row_id}"
    stored, hexed, encoding = out.stdout.strip().split("|")
    body = bytes.fromhex(hexed)
    return int(stored), gzip.decompress(body) if encoding == "gzip" else body


def sqlite_shell(path: Path, sql: str) -> str:
    """What the ``sqlite3`` shell prints for ``sql`` on ``path``, opened read-only."""
    out = subprocess.run(
        ["sqlite3", "-readonly", "-bail", "-cmd", ".timeout 30000", str(path), sql],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"sqlite3 {path}: {out.stderr.strip()}"
    return out.stdout


def sqlite_rows_without_body(data_dir: Path) -> list[str]:
    """With the ``sqlite3`` shell alone, the catalog and each bodies file joined in
    SQL: the rows naming a body (``offset`` = its id) that their file lacks, or holds
    with another stored size than the row's ``length``."""
    catalog = data_dir / "metadata.db"
    if not catalog.exists():
        return []
    names = sqlite_shell(
        catalog, "SELECT DISTINCT archive FROM artifacts WHERE archive LIKE '%.sqlite'"
    ).split()
    problems = []
    for name in names:
        size = "length(CAST(x.body AS BLOB))"
        problems += sqlite_shell(
            catalog,
            f"ATTACH '{data_dir / name}' AS b; "
            f"SELECT a.url || ': ' || coalesce({size}, 'no body') || ' bytes, the row says ' "
            f'|| a.length FROM artifacts a LEFT JOIN b.bodies x ON x.id = a."offset" '
            f"WHERE a.archive = '{name}' AND (x.id IS NULL OR {size} IS NOT a.length)",
        ).splitlines()
    return problems


def record_problem(data_dir: Path, archive: str, offset: int, length: int) -> tuple[str, bytes]:
    """("", body) when the record a row points at reads back; else (what is wrong, b"")."""
    if archive.endswith(".sqlite"):
        # A row names the body's id (offset) and its stored size (length).
        path = data_dir / archive
        if not path.exists():
            return f"{archive}: no such file", b""
        try:
            stored, body = sqlite_body(path, offset)
        except (AssertionError, OSError) as exc:
            return f"{archive} id {offset} does not read back: {exc}", b""
        if stored != length:
            return f"{archive} id {offset} stores {stored} bytes, the row says {length}", b""
        return "", body
    end = offset + length
    try:
        with open(data_dir / archive, "rb") as f:  # the name the row gives, nothing else
            size = os.fstat(f.fileno()).st_size
            if end > size:
                return f"{archive}[{offset}:{end}] ends beyond the file's {size} bytes", b""
            f.seek(offset)
            raw = f.read(length)
    except FileNotFoundError:
        return f"{archive}: no such file", b""
    try:
        return "", reader(archive)(raw)
    except Exception as exc:  # any way the bytes fail to read is the finding
        return f"{archive}[{offset}:{end}] does not read back: {exc!r}", b""


def assert_every_row_reads_back(data_dir: Path, site) -> int:
    """Every row's record is within its file and holds the bytes ``site`` served for
    the row's final URL; returns the number of rows."""
    problems = []
    rows = catalog_rows(data_dir)
    for _key, url, final_url, status, size, archive, offset, length in rows:
        problem, body = record_problem(data_dir, archive, offset, length)
        if not problem and body != site.payload(urlsplit(final_url).path):
            problem = f"{archive}[{offset}:{offset + length}] holds other bytes"
        if not problem and len(body) != size:
            problem = f"the row says {size} bytes, the record holds {len(body)}"
        if problem:
            problems.append(f"{url} (status {status}): {problem}")
    assert not problems, f"{len(problems)} of {len(rows)} rows do not read back: {problems[:5]}"
    return len(rows)
