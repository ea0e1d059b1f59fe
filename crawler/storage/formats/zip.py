"""Zip archives of bodies (``ARCHIVE_FORMAT=zip``): ``<key[:2]>/<key>.<ext>`` entries.

Each body is one deflated entry; what a WARC record's headers would say (URL, status,
HTTP headers, fetch time, key) travels as JSON in the entry's local extra field
(id ``0x7863``), so the local headers alone can rebuild the catalog and the central
directory. A 304 revalidation, and a page fetched again unchanged, become an empty
``<key[:2]>/<key>.revisit`` entry: its metadata is all it holds, so the central
directory leaves its extra field out (zip allows the two to differ), which halves it.

A file being written has a ``.zip.writing`` marker beside it; ``zipfile`` cannot open
it until it is closed or :meth:`ZipFormat.repair` (run on start by
:func:`crawler.storage.store.recover`) has cut a partial entry and written the central
directory. Each entry is readable at its row's offset and length meanwhile.

Longer than the project's other modules on purpose: a format is one module (writer,
reader, indexer, repair), so that adding one touches the registry and one new file.
"""

from __future__ import annotations

import json
import mimetypes
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from crawler.storage.errors import ArchiveError, TruncatedRecordError
from crawler.storage.formats.base import (
    ArchiveFormat,
    ArchiveWriter,
    Repair,
    Scan,
    closed_name,
    finish_repair,
    save_tail,
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

META_EXTRA_ID = 0x7863
# Without ZIP64 a zip holds at most 65,535 entries and 4 GiB: roll over before either.
MAX_ENTRIES = 65_000
MAX_BYTES = 4_000_000_000

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<4sHHHHIIH")
_LOCAL_SIG = b"PK\x03\x04"
_CENTRAL_SIG = b"PK\x01\x02"
_EOCD_SIG = b"PK\x05\x06"
_UTF8_FLAG = 0x800
REVISIT_SUFFIX = ".revisit"
_REVISIT_NAME_END = REVISIT_SUFFIX.encode("ascii")
_ROW_HEADERS = {"content-type", "content-length", "etag", "last-modified"}
_EXTENSIONS = {"text/html": ".html", "text/plain": ".txt", "application/json": ".json"}


class ZipArchiveError(ArchiveError):
    """A zip entry cannot be read back."""


@dataclass
class Entry:
    name: bytes
    extra: bytes
    method: int
    crc: int
    csize: int
    usize: int
    offset: int
    dostime: int
    dosdate: int

    @property
    def end(self) -> int:
        return self.offset + _LOCAL.size + len(self.name) + len(self.extra) + self.csize


def extension(content_type: str | None) -> str:
    """The file extension of a content type (``.html`` for HTML, ``.bin`` if unknown)."""
    mime = (content_type or "").split(";")[0].strip().lower()
    if not mime:
        return ".bin"
    return _EXTENSIONS.get(mime) or mimetypes.guess_extension(mime) or ".bin"


def _dos_time(ts: float) -> tuple[int, int]:
    t = time.gmtime(ts)
    dostime = (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2)
    dosdate = ((max(t.tm_year, 1980) - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday
    return dostime, dosdate


def _meta_extra(meta: dict) -> bytes:
    data = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    if len(data) > 65_000:  # an extra field holds 64 KiB: keep what identifies the body
        meta = {**meta, "headers": [h for h in meta["headers"] if h[0].lower() == "content-type"]}
        data = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    return struct.pack("<HH", META_EXTRA_ID, len(data)) + data


def _meta_of(extra: bytes) -> dict | None:
    pos = 0
    while pos + 4 <= len(extra):
        kind, size = struct.unpack_from("<HH", extra, pos)
        if kind == META_EXTRA_ID:
            return json.loads(extra[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return None


def _local_header(entry: Entry) -> bytes:
    return (
        _LOCAL.pack(
            _LOCAL_SIG,
            20,
            _UTF8_FLAG,
            entry.method,
            entry.dostime,
            entry.dosdate,
            entry.crc,
            entry.csize,
            entry.usize,
            len(entry.name),
            len(entry.extra),
        )
        + entry.name
        + entry.extra
    )


def central_directory(entries: list[Entry], start: int) -> bytes:
    """Central directory and end record for ``entries``, to be written at ``start``.
    A revisit entry's metadata is in its local header only (see the module's
    docstring): every reader here reads local headers."""
    parts = []
    for e in entries:
        extra = b"" if e.name.endswith(_REVISIT_NAME_END) else e.extra
        parts.append(
            _CENTRAL.pack(
                _CENTRAL_SIG,
                20,
                20,
                _UTF8_FLAG,
                e.method,
                e.dostime,
                e.dosdate,
                e.crc,
                e.csize,
                e.usize,
                len(e.name),
                len(extra),
                0,
                0,
                0,
                0o644 << 16,
                e.offset,
            )
            + e.name
            + extra
        )
    cd = b"".join(parts)
    n = len(entries)
    return cd + _EOCD.pack(_EOCD_SIG, 0, 0, n, n, len(cd), start, 0)


class ZipWriter(ArchiveWriter):
    """Appends bodies to rolling ``.zip`` files; the central directory is written on close."""

    suffix = ".zip"

    def __init__(
        self,
        directory: str | os.PathLike,
        data_dir: str | os.PathLike,
        prefix: str = "crawl",
        rollover_bytes: int = 1_000_000_000,
        gzip_level: int = 6,
        rollover_seconds: float = 0.0,
    ):
        super().__init__(
            directory, data_dir, prefix, min(rollover_bytes, MAX_BYTES), rollover_seconds
        )
        self.level = gzip_level
        self._entries: list[Entry] = []

    def _started(self) -> None:
        self._entries = []

    def _append(self, name: str, body: bytes, meta: dict, ts: float) -> Entry:
        if self._file is None:
            self._open()
        if body and self.level > 0:
            comp = zlib.compressobj(self.level, zlib.DEFLATED, -15)
            data, method = comp.compress(body) + comp.flush(), 8
        else:
            data, method = body, 0
        dostime, dosdate = _dos_time(ts)
        entry = Entry(
            name=name.encode("utf-8"),
            extra=_meta_extra(meta),
            method=method,
            crc=zlib.crc32(body),
            csize=len(data),
            usize=len(body),
            offset=self.size,
            dostime=dostime,
            dosdate=dosdate,
        )
        self._write(_local_header(entry) + data)
        self._entries.append(entry)
        return entry

    def write_fetch(self, fetch: Fetch, digest: str | None = None) -> Row:
        content_type = header(fetch.response_headers, "Content-Type")
        date = warc_date(fetch.fetched_at)
        digest = digest or payload_digest(fetch.body)
        meta = {
            "type": "response",
            "key": fetch.key,
            "url": fetch.url,
            "final_url": fetch.final_url,
            "method": fetch.method,
            "status": fetch.status,
            "headers": payload_headers(fetch.response_headers, len(fetch.body)),
            "fetched_at": date,
            "digest": digest,
        }
        if not fetch.parsed:
            meta[DOWNLOAD_META] = 1
        name = f"{fetch.key[:2]}/{fetch.key}{extension(content_type)}"
        entry = self._append(name, fetch.body, meta, fetch.fetched_at)
        self.records_written += 1
        return fetch_row(fetch, self.relpath, entry.offset, entry.end - entry.offset, digest)

    def write_revisit(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        meta = {
            "type": "revisit",
            "key": fetch.key,
            "url": fetch.url,
            "final_url": fetch.final_url,
            "method": fetch.method,
            "status": fetch.status,
            "headers": payload_headers(fetch.response_headers, 0),
            "fetched_at": warc_date(fetch.fetched_at),
            "refers_to_date": refers_to_date,
        }
        self._append(f"{fetch.key[:2]}/{fetch.key}{REVISIT_SUFFIX}", b"", meta, fetch.fetched_at)
        self.records_written += 1

    def write_unchanged(self, fetch: Fetch, original: Row) -> Row:
        """An empty ``.revisit`` entry whose metadata names the payload's digest and
        the record holding it (its key, URL and date); the row points at that one."""
        meta = {
            "type": "revisit",
            "profile": "identical-payload-digest",
            "key": fetch.key,
            "url": fetch.url,
            "final_url": fetch.final_url,
            "method": fetch.method,
            "status": fetch.status,
            # Those its row takes: a zip keeps metadata twice (local and central).
            "headers": [
                h
                for h in payload_headers(fetch.response_headers, len(fetch.body))
                if h[0].lower() in _ROW_HEADERS
            ],
            "fetched_at": warc_date(fetch.fetched_at),
            "digest": original.payload_digest,
            "refers_to": refers_to(original),
            "refers_to_uri": original.final_url,
            "refers_to_date": original.fetched_at,
        }
        if not fetch.parsed:
            meta[DOWNLOAD_META] = 1
        self._append(f"{fetch.key[:2]}/{fetch.key}{REVISIT_SUFFIX}", b"", meta, fetch.fetched_at)
        self.records_written += 1
        return fetch_row(
            fetch, original.archive, original.offset, original.length, original.payload_digest
        )

    def needs_rollover(self) -> bool:
        return super().needs_rollover() or (
            self._file is not None and len(self._entries) >= MAX_ENTRIES
        )

    def _finishing(self) -> None:
        self._file.write(central_directory(self._entries, self.size))


# -- reading ---------------------------------------------------------------------------


def _parse_local(buf: bytes, pos: int, where: str) -> Entry:
    if buf[pos : pos + 4] != _LOCAL_SIG:
        raise ZipArchiveError(f"{where}: no zip entry starts here")
    if len(buf) < pos + _LOCAL.size:
        raise TruncatedRecordError(f"{where}: file ends inside an entry header")
    _, _, flags, method, dostime, dosdate, crc, csize, usize, nlen, xlen = _LOCAL.unpack_from(
        buf, pos
    )
    start = pos + _LOCAL.size
    entry = Entry(
        name=bytes(buf[start : start + nlen]),
        extra=bytes(buf[start + nlen : start + nlen + xlen]),
        method=method,
        crc=crc,
        csize=csize,
        usize=usize,
        offset=pos,
        dostime=dostime,
        dosdate=dosdate,
    )
    if flags & 0x08 or method not in (0, 8):
        raise ZipArchiveError(f"{where}: entry written by another tool (flags {flags})")
    return entry


def _body(buf: bytes, entry: Entry, base: int, where: str) -> bytes:
    start = entry.end - entry.csize - base
    data = buf[start : start + entry.csize]
    if len(data) < entry.csize:
        raise TruncatedRecordError(f"{where}: file ends inside the entry")
    try:
        body = zlib.decompress(data, -15) if entry.method == 8 else bytes(data)
    except zlib.error as exc:
        raise ZipArchiveError(f"{where}: corrupt deflate data ({exc})") from exc
    if len(body) != entry.usize or zlib.crc32(body) != entry.crc:
        raise ZipArchiveError(f"{where}: CRC or size mismatch")
    return body


def decode_entry(data: bytes, path, offset: int) -> StoredRecord:
    """A stored response from the bytes of one entry (local header + data)."""
    where = f"{path}: offset {offset}"
    entry = _parse_local(data, 0, where)
    entry.offset = offset
    body = _body(data, entry, offset, where)
    meta = _meta_of(entry.extra)
    if meta is None:
        raise ZipArchiveError(f"{where}: entry has no crawl metadata")
    return _stored(meta, body)


def _stored(meta: dict, body: bytes) -> StoredRecord:
    warc_headers = [
        ("WARC-Type", meta["type"]),
        ("WARC-Target-URI", meta["final_url"]),
        ("WARC-Date", meta["fetched_at"]),
        (KEY_HEADER, meta["key"]),
        (REQUESTED_URI_HEADER, meta["url"]),
        (METHOD_HEADER, meta["method"]),
    ]
    if meta.get("digest"):
        warc_headers.append(("WARC-Payload-Digest", meta["digest"]))
    return StoredRecord(
        url=meta["final_url"],
        status=int(meta["status"]),
        headers=[tuple(h) for h in meta["headers"]],
        body=body,
        warc_headers=warc_headers,
    )


def iter_entries(path: Path):
    """Yield ``(entry, meta, body)`` for each complete entry from the start of the file.

    Reads one entry at a time. Stops at the central directory; raises an
    :class:`ArchiveError` naming the offset at the first entry that is cut short or
    does not check out.
    """
    with open(path, "rb") as f:
        pos = 0
        while True:
            head = f.read(_LOCAL.size)
            if not head or head[:4] in (_CENTRAL_SIG, _EOCD_SIG):
                return
            where = f"{path}: offset {pos}"
            if head[:4] != _LOCAL_SIG:
                raise ZipArchiveError(f"{where}: no zip entry starts here")
            if len(head) < _LOCAL.size:
                raise TruncatedRecordError(f"{where}: file ends inside an entry header")
            fields = _LOCAL.unpack(head)
            size = fields[7] + fields[9] + fields[10]  # compressed data, name, extra
            rest = f.read(size)
            if len(rest) < size:
                raise TruncatedRecordError(f"{where}: file ends inside the entry")
            data = head + rest
            entry = _parse_local(data, 0, where)
            entry.offset = pos
            body = _body(data, entry, pos, where)
            yield entry, _meta_of(entry.extra), body
            pos = entry.end


def index_meta(meta: dict | None, body: bytes, entry: Entry, relpath: str, out: Indexed) -> None:
    """Add what one entry says about the catalog to ``out``."""
    if not meta:
        return
    headers = meta["headers"]
    download = bool(meta.get(DOWNLOAD_META))
    if meta["type"] == "response":
        length = entry.end - entry.offset
        out.add(meta_row(meta, headers, relpath, entry.offset, length, len(body)), download)
    elif meta["type"] == "revisit" and meta.get("refers_to"):
        out.add(revisit_row(meta, headers), download)
    elif meta["type"] == "revisit":
        out.touches.append(
            (
                meta["key"],
                header(headers, "ETag"),
                header(headers, "Last-Modified"),
                meta["fetched_at"],
            )
        )


class ZipFormat(ArchiveFormat):
    name = "zip"
    suffix = ZipWriter.suffix
    what = "entry"

    def writer(self, directory, data_dir, *, gzip_level: int, compressor: str, **options):
        # ARCHIVE_GZIP_LEVEL and ARCHIVE_COMPRESSOR are the WARC writer's: entries are
        # deflated by zlib at its default level, as zip readers expect.
        return ZipWriter(directory, data_dir, **options)

    def decode(self, data: bytes, path, offset: int) -> StoredRecord:
        return decode_entry(data, path, offset)

    def index(self, path: Path, data_dir: Path, relpath: str | None = None) -> Indexed:
        relpath = relpath or os.path.relpath(path, data_dir)
        out = Indexed()
        for entry, meta, body in iter_entries(path):
            index_meta(meta, body, entry, relpath, out)
        return out

    def scan(self, path: Path, relpath: str, scan: Scan) -> None:
        try:
            for entry, meta, body in iter_entries(path):
                index_meta(meta, body, entry, relpath, scan.indexed)
                scan.records += 1
        except ArchiveError as exc:
            scan.problems.append(f"{exc}; the entries after it are not indexed")
            if isinstance(exc, TruncatedRecordError):
                scan.cut.append(path)

    def repair(self, path: Path, data_dir: Path) -> Repair:
        """A partial entry is cut off (kept beside the file as ``<name>.cut-<time>``)
        and the central directory written; the complete entries are returned as rows."""
        closed = closed_name(path)
        relpath = os.path.relpath(closed, data_dir)
        out = Indexed()
        entries: list[Entry] = []
        good_end = 0
        try:
            for entry, meta, body in iter_entries(path):
                index_meta(meta, body, entry, relpath, out)
                entries.append(entry)
                good_end = entry.end
        except ArchiveError:
            pass
        cut_file = None
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(good_end)
            # A central directory cut short is rewritten, not kept.
            if size > good_end and f.read(4) != _CENTRAL_SIG:
                cut_file = save_tail(f, good_end, closed)
            f.truncate(good_end)
            f.seek(good_end)
            f.write(central_directory(entries, good_end))
            f.flush()
            os.fsync(f.fileno())
        finish_repair(path, closed)
        return Repair(closed, len(entries), size - good_end if cut_file else 0, cut_file, out)


FORMAT = ZipFormat()
