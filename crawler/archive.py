"""WARC archives: one gzip member per record, random access by offset.

A file being written is named ``*.warc.gz.open`` and renamed when closed. Rows of the
catalog name the closed file; :func:`resolve` finds either. Each fetch becomes a
``response`` record (its offset and length go to the catalog) and a ``request``
record; a 304 revalidation becomes a ``revisit`` record, so that the archive alone
can rebuild the catalog.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from isal import isal_zlib
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders, StatusAndHeadersParser
from warcio.warcwriter import WARCWriter

from crawler.catalog import Row

OPEN_SUFFIX = ".open"
ARCHIVE_GLOB = "*.warc.gz"
KEY_HEADER = "X-Crawl-Key"
REQUESTED_URI_HEADER = "X-Crawl-Requested-URI"
METHOD_HEADER = "X-Crawl-Method"
# A rendered page (middlewares/render.py): its response record says a conversion record
# (the DOM the browser rendered) follows; the conversion record carries the status and
# validators of the response, and gets the catalog row.
RENDERED_HEADER = "X-Crawl-Rendered"
STATUS_HEADER = "X-Crawl-Status"
ETAG_HEADER = "X-Crawl-ETag"
LAST_MODIFIED_HEADER = "X-Crawl-Last-Modified"
REVISIT_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
# Headers that no longer describe the stored payload once Scrapy decoded it; the
# server's values are kept under this prefix (the convention replay tools know).
ORIG_PREFIX = "X-Archive-Orig-"
_READ_CHUNK = 1 << 20

Headers = list[tuple[str, str]]


class ArchiveError(Exception):
    """A record cannot be read back."""


class TruncatedRecordError(ArchiveError):
    """The file ends inside a gzip member."""


@dataclass
class Fetch:
    """One answer from a server, as the crawl received it (bodies already decoded)."""

    key: str
    url: str
    final_url: str
    method: str
    request_headers: Headers
    request_body: bytes
    status: int
    response_headers: Headers
    body: bytes
    fetched_at: float = field(default_factory=time.time)
    # What a browser rendered from ``body`` (the DOM the spider parsed), if it did.
    rendered_body: bytes | None = None
    rendered_type: str = "text/html; charset=utf-8"


@dataclass
class StoredRecord:
    url: str
    status: int
    headers: Headers
    body: bytes
    warc_headers: Headers


def warc_date(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resolve(data_dir: Path, relpath: str) -> Path:
    """The file a catalog row names: closed, or still open for writing."""
    path = Path(data_dir) / relpath
    if path.exists():
        return path
    open_path = path.with_name(path.name + OPEN_SUFFIX)
    return open_path if open_path.exists() else path


def header(headers: Headers, name: str) -> str | None:
    lname = name.lower()
    for k, v in headers:
        if k.lower() == lname:
            return v
    return None


def payload_headers(headers: Headers, body_length: int) -> Headers:
    """Headers that describe the payload as stored (de-chunked, decoded)."""
    out: Headers = []
    for name, value in headers:
        lname = name.lower()
        if lname == "transfer-encoding" or (
            lname == "content-length" and value.strip() != str(body_length)
        ):
            out.append((ORIG_PREFIX + name, value))
        elif lname != "content-length":
            out.append((name, value))
    out.append(("Content-Length", str(body_length)))
    return out


COMPRESSORS = {"isal": isal_zlib, "zlib": zlib}
MAX_LEVEL = {"isal": 3, "zlib": 9}


def gzip_member(data: bytes | list, level: int, compressor: str = "isal") -> bytes:
    """One complete gzip member holding ``data`` (bytes, or a list of parts).

    ISA-L at level 1 compresses as small as zlib at level 1 at about four times the
    speed (and sixteen times zlib's level 6), which is what lets one writer keep up
    with a crawl. Readers need nothing special: the output is plain gzip.
    """
    module = COMPRESSORS[compressor]
    comp = module.compressobj(level, module.DEFLATED, 31)
    if isinstance(data, list):
        return b"".join([*map(comp.compress, data), comp.flush()])
    return comp.compress(data) + comp.flush()


class RollingFile:
    """A file written as ``<dir>/<prefix>-<time>-<pid>-<seq><suffix>.open``.

    It is renamed to its closed name by :meth:`close` (after a flush and fsync), and a
    writer starts a new one once :meth:`needs_rollover` says so. Subclasses write the
    records; ``_started`` and ``_finishing`` are their hooks at either end of a file.
    """

    suffix = ""

    def __init__(
        self,
        directory: str | os.PathLike,
        data_dir: str | os.PathLike,
        prefix: str = "crawl",
        rollover_bytes: int = 1_000_000_000,
        rollover_seconds: float = 0.0,
    ):
        self.directory = Path(directory)
        self.data_dir = Path(data_dir)
        self.prefix = prefix
        self.rollover_bytes = rollover_bytes
        # A file also rolls over this long after it was opened (0: by size only), so
        # that closed files can be shipped while a slow crawl runs.
        self.rollover_seconds = rollover_seconds
        self.directory.mkdir(parents=True, exist_ok=True)
        self._file: io.BufferedWriter | None = None
        self._seq = 0
        self.name = ""
        self.size = 0
        self.closed_files: list[Path] = []
        self.records_written = 0

    @property
    def path(self) -> Path:
        return self.directory / self.name

    @property
    def relpath(self) -> str:
        return os.path.relpath(self.path, self.data_dir)

    def _open(self) -> None:
        self._seq += 1
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
        self.name = f"{self.prefix}-{stamp}-{os.getpid()}-{self._seq:05d}{self.suffix}"
        self._file = open(self.path.with_name(self.name + OPEN_SUFFIX), "xb")
        self.size = 0
        self._opened_at = time.monotonic()
        self._started()

    def _started(self) -> None:
        """Called when a new file is open."""

    def _finishing(self) -> None:
        """Called before a file is flushed, closed and renamed."""

    def flush(self, fsync: bool = True) -> None:
        if self._file is not None:
            self._file.flush()
            if fsync:
                os.fsync(self._file.fileno())

    def needs_rollover(self) -> bool:
        if self._file is None:
            return False
        return self.size >= self.rollover_bytes or (
            self.rollover_seconds > 0
            and time.monotonic() - self._opened_at >= self.rollover_seconds
        )

    def close(self) -> Path | None:
        """Finish, flush, fsync and rename the open file to its closed name."""
        if self._file is None:
            return None
        self._finishing()
        self.flush(fsync=True)
        self._file.close()
        self._file = None
        os.rename(self.path.with_name(self.name + OPEN_SUFFIX), self.path)
        fsync_dir(self.directory)
        self.closed_files.append(self.path)
        return self.path


class ArchiveWriter(RollingFile):
    """Appends WARC records, each its own gzip member, to rolling ``.warc.gz`` files."""

    suffix = ".warc.gz"

    def __init__(
        self,
        directory: str | os.PathLike,
        data_dir: str | os.PathLike,
        prefix: str = "crawl",
        rollover_bytes: int = 1_000_000_000,
        gzip_level: int = 1,
        compressor: str = "isal",
        software: str = "research-crawler",
        rollover_seconds: float = 0.0,
    ):
        super().__init__(directory, data_dir, prefix, rollover_bytes, rollover_seconds)
        self.gzip_level = gzip_level
        self.compressor = compressor
        self.software = software

    def _started(self) -> None:
        self._append(self._warcinfo())

    def _warcinfo(self) -> bytes:
        info = {
            "software": self.software,
            "hostname": socket.gethostname(),
            "format": "WARC File Format 1.1",
            "conformsTo": "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/",
        }
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=False, warc_version="1.1")
        writer.write_record(writer.create_warcinfo_record(self.name, info))
        return buf.getvalue()

    def _append(self, record: bytes | list) -> tuple[int, int]:
        member = gzip_member(record, self.gzip_level, self.compressor)
        offset = self.size
        self._file.write(member)
        self.size += len(member)
        return offset, len(member)

    # -- records -------------------------------------------------------------------

    def write_fetch(self, fetch: Fetch) -> Row:
        """Write the response and request records of a fetch; returns its catalog row."""
        if self._file is None:
            self._open()
        date = warc_date(fetch.fetched_at)
        body = fetch.body
        http_headers = StatusAndHeaders(
            f"{fetch.status} {_reason(fetch.status)}",
            payload_headers(fetch.response_headers, len(body)),
            protocol="HTTP/1.1",
        )
        record_id = make_warc_id()
        digest = payload_digest(body)
        response = warc_record(
            "response",
            record_id,
            [
                ("WARC-Date", date),
                ("WARC-Target-URI", fetch.final_url),
                (KEY_HEADER, fetch.key),
                (REQUESTED_URI_HEADER, fetch.url),
                (METHOD_HEADER, fetch.method),
                *([(RENDERED_HEADER, "1")] if fetch.rendered_body is not None else []),
            ],
            http_headers,
            body,
            digest=digest,
        )
        offset, length = self._append(response)
        self._append(self._request_record(fetch, date, record_id))
        self.records_written += 1
        if fetch.rendered_body is not None:
            return self._write_conversion(fetch, date, record_id)
        return Row(
            key=fetch.key,
            url=fetch.url,
            final_url=fetch.final_url,
            status=fetch.status,
            content_type=header(fetch.response_headers, "Content-Type"),
            bytes=len(body),
            etag=header(fetch.response_headers, "ETag"),
            last_modified=header(fetch.response_headers, "Last-Modified"),
            fetched_at=date,
            archive=self.relpath,
            offset=offset,
            length=length,
            payload_digest=digest,
            method=fetch.method,
        )

    def _write_conversion(self, fetch: Fetch, date: str, refers_to: str) -> Row:
        """The rendered DOM as a ``conversion`` record of the response; its row."""
        body = fetch.rendered_body
        etag = header(fetch.response_headers, "ETag")
        last_modified = header(fetch.response_headers, "Last-Modified")
        digest = payload_digest(body)
        record = warc_record(
            "conversion",
            make_warc_id(),
            [
                ("WARC-Date", date),
                ("WARC-Target-URI", fetch.final_url),
                ("WARC-Refers-To", refers_to),
                (KEY_HEADER, fetch.key),
                (REQUESTED_URI_HEADER, fetch.url),
                (METHOD_HEADER, fetch.method),
                (STATUS_HEADER, str(fetch.status)),
                *([(ETAG_HEADER, etag)] if etag else []),
                *([(LAST_MODIFIED_HEADER, last_modified)] if last_modified else []),
            ],
            None,
            body,
            digest=digest,
            content_type=fetch.rendered_type,
        )
        offset, length = self._append(record)
        return Row(
            key=fetch.key,
            url=fetch.url,
            final_url=fetch.final_url,
            status=fetch.status,
            content_type=fetch.rendered_type,
            bytes=len(body),
            etag=etag,
            last_modified=last_modified,
            fetched_at=date,
            archive=self.relpath,
            offset=offset,
            length=length,
            payload_digest=digest,
            method=fetch.method,
            rendered=1,
        )

    def _request_record(self, fetch: Fetch, date: str, concurrent_to: str) -> list:
        parts = urlsplit(fetch.final_url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = list(fetch.request_headers)
        if header(headers, "Host") is None:
            headers.insert(0, ("Host", parts.netloc))
        http_headers = StatusAndHeaders(
            f"{fetch.method} {target} HTTP/1.1", headers, is_http_request=True
        )
        return warc_record(
            "request",
            make_warc_id(),
            [
                ("WARC-Date", date),
                ("WARC-Target-URI", fetch.final_url),
                ("WARC-Concurrent-To", concurrent_to),
            ],
            http_headers,
            fetch.request_body,
            digest=payload_digest(fetch.request_body),
        )

    def write_revisit(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        """Record a 304 answer: the stored body is still current."""
        if self._file is None:
            self._open()
        http_headers = StatusAndHeaders(
            f"{fetch.status} {_reason(fetch.status)}",
            payload_headers(fetch.response_headers, 0),
            protocol="HTTP/1.1",
        )
        warc_headers = [
            ("WARC-Date", warc_date(fetch.fetched_at)),
            ("WARC-Target-URI", fetch.final_url),
            ("WARC-Profile", REVISIT_PROFILE),
            (KEY_HEADER, fetch.key),
            (REQUESTED_URI_HEADER, fetch.url),
            (METHOD_HEADER, fetch.method),
        ]
        if refers_to_date:
            warc_headers.append(("WARC-Refers-To-Target-URI", fetch.final_url))
            warc_headers.append(("WARC-Refers-To-Date", refers_to_date))
        # A revisit's block is the HTTP headers alone.
        self._append(warc_record("revisit", make_warc_id(), warc_headers, http_headers, b""))
        self.records_written += 1


def make_warc_id() -> str:
    return StatusAndHeadersParser.make_warc_id()


def payload_digest(data) -> str:
    """The digest WARC records carry: ``sha1:`` and base32."""
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode("ascii")


_MSGTYPE = {
    "response": "application/http; msgtype=response",
    "revisit": "application/http; msgtype=response",
    "request": "application/http; msgtype=request",
}


def warc_record(
    rec_type: str,
    record_id: str,
    headers: Headers,
    http_headers: StatusAndHeaders | None,
    payload,
    digest: str | None = None,
    content_type: str | None = None,
) -> list:
    """A WARC/1.1 record as the list of its parts (header block, HTTP headers, payload,
    end), serialised by warcio's ``StatusAndHeaders`` as its ``WARCWriter`` does.

    The digests are computed here in one pass each: warcio's writer would re-read the
    payload in 16 KiB chunks to compute them, and build every record through several
    header rewrites, which together cost as much as compressing the record.
    """
    http_block = http_headers.to_ascii_bytes() if http_headers is not None else b""
    block = hashlib.sha1(http_block)
    block.update(payload)
    warc_headers = [("WARC-Type", rec_type), ("WARC-Record-ID", record_id), *headers]
    if digest:
        warc_headers.append(("WARC-Payload-Digest", digest))
    warc_headers += [
        ("WARC-Block-Digest", "sha1:" + base64.b32encode(block.digest()).decode("ascii")),
        ("Content-Type", content_type or _MSGTYPE[rec_type]),
        ("Content-Length", str(len(http_block) + len(payload))),
    ]
    head = StatusAndHeaders("", warc_headers, protocol="WARC/1.1").to_bytes()
    return [head, http_block, payload, b"\r\n\r\n"]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------


def iter_members(f, start: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, length, uncompressed bytes)`` of each gzip member of ``f``.

    Raises :class:`TruncatedRecordError` at a member the file ends inside, and
    :class:`ArchiveError` at one that does not decompress; both carry the offset.
    """
    f.seek(start)
    pos = start
    buf = f.read(_READ_CHUNK)
    while buf:
        member_start = pos
        inflater = zlib.decompressobj(31)
        out = []
        while True:
            try:
                out.append(inflater.decompress(buf))
            except zlib.error as exc:
                raise ArchiveError(f"offset {member_start}: corrupt gzip member ({exc})") from exc
            if inflater.eof:
                rest = inflater.unused_data
                pos += len(buf) - len(rest)
                buf = rest or f.read(_READ_CHUNK)
                break
            pos += len(buf)
            buf = f.read(_READ_CHUNK)
            if not buf:
                raise TruncatedRecordError(f"offset {member_start}: file ends inside a record")
        yield member_start, pos - member_start, b"".join(out)


def parse_record(data: bytes):
    """Parse one uncompressed WARC record; returns warcio's record with its content read."""
    if not data.startswith(b"WARC/"):
        raise ArchiveError("not a WARC record")
    for record in ArchiveIterator(io.BytesIO(data), no_record_parse=False):
        content = record.content_stream().read()
        return record, content
    raise ArchiveError("empty record")


def read_record(path: str | os.PathLike, offset: int, length: int) -> StoredRecord:
    """Read the response record at ``offset`` of an archive file."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) < length:
        raise TruncatedRecordError(f"{path}: offset {offset}: file ends inside the record")
    try:
        raw = zlib.decompress(data, 31)
        record, body = parse_record(raw)
    except (zlib.error, ArchiveError, ValueError) as exc:
        raise ArchiveError(f"{path}: offset {offset}: unreadable record ({exc})") from exc
    return stored_record(record, body)


def stored_record(record, body: bytes) -> StoredRecord:
    if record.rec_type == "conversion":
        return conversion_record(list(record.rec_headers.headers), body)
    http = record.http_headers
    return StoredRecord(
        url=record.rec_headers.get_header("WARC-Target-URI"),
        status=int(http.get_statuscode()) if http else 0,
        headers=list(http.headers) if http else [],
        body=body,
        warc_headers=list(record.rec_headers.headers),
    )


def conversion_record(warc_headers: Headers, body: bytes) -> StoredRecord:
    """A rendered page as the spider saw it: the response's status, the DOM as body."""
    return StoredRecord(
        url=header(warc_headers, "WARC-Target-URI"),
        status=int(header(warc_headers, STATUS_HEADER) or 200),
        headers=[("Content-Type", header(warc_headers, "Content-Type") or "text/html")],
        body=body,
        warc_headers=warc_headers,
    )


@dataclass
class Indexed:
    """What an archive file holds, as catalog rows and 304 refreshes."""

    rows: list[Row] = field(default_factory=list)
    touches: list[tuple[str, str | None, str | None, str]] = field(default_factory=list)


def index_record(record, relpath: str, offset: int, length: int, out: Indexed) -> None:
    """Add what one parsed record says about the catalog to ``out``."""
    rec = record.rec_headers
    key = rec.get_header(KEY_HEADER)
    if not key:
        return
    http = record.http_headers
    headers = list(http.headers) if http else []
    if record.rec_type == "conversion":
        out.rows.append(_conversion_row(record, key, relpath, offset, length))
    elif record.rec_type == "response" and not rec.get_header(RENDERED_HEADER):
        # (A rendered page's row points at its conversion record, written next.)
        out.rows.append(
            Row(
                key=key,
                url=rec.get_header(REQUESTED_URI_HEADER) or rec.get_header("WARC-Target-URI"),
                final_url=rec.get_header("WARC-Target-URI"),
                status=int(http.get_statuscode()),
                content_type=header(headers, "Content-Type"),
                bytes=int(header(headers, "Content-Length") or 0),
                etag=header(headers, "ETag"),
                last_modified=header(headers, "Last-Modified"),
                fetched_at=rec.get_header("WARC-Date"),
                archive=relpath,
                offset=offset,
                length=length,
                payload_digest=rec.get_header("WARC-Payload-Digest"),
                method=rec.get_header(METHOD_HEADER) or "GET",
            )
        )
    elif record.rec_type == "revisit":
        out.touches.append(
            (
                key,
                header(headers, "ETag"),
                header(headers, "Last-Modified"),
                rec.get_header("WARC-Date"),
            )
        )


def _conversion_row(record, key: str, relpath: str, offset: int, length: int) -> Row:
    rec = record.rec_headers
    return Row(
        key=key,
        url=rec.get_header(REQUESTED_URI_HEADER) or rec.get_header("WARC-Target-URI"),
        final_url=rec.get_header("WARC-Target-URI"),
        status=int(rec.get_header(STATUS_HEADER) or 200),
        content_type=rec.get_header("Content-Type"),
        bytes=int(rec.get_header("Content-Length") or 0),
        etag=rec.get_header(ETAG_HEADER),
        last_modified=rec.get_header(LAST_MODIFIED_HEADER),
        fetched_at=rec.get_header("WARC-Date"),
        archive=relpath,
        offset=offset,
        length=length,
        payload_digest=rec.get_header("WARC-Payload-Digest"),
        method=rec.get_header(METHOD_HEADER) or "GET",
        rendered=1,
    )


def index_file(path: Path, data_dir: Path, relpath: str | None = None) -> Indexed:
    """Index every complete record of one archive file (stops at a truncated tail)."""
    relpath = relpath or os.path.relpath(path, data_dir)
    out = Indexed()
    with open(path, "rb") as f:
        for offset, length, raw in iter_members(f):
            record, _ = parse_record(raw)
            index_record(record, relpath, offset, length, out)
    return out


@dataclass
class Repair:
    path: Path
    records: int
    cut_bytes: int
    cut_file: Path | None
    indexed: Indexed


def repair_open_file(open_path: Path, data_dir: Path) -> Repair:
    """Close an archive left open by a killed run.

    A partial trailing record is cut off (the cut bytes are kept beside the file as
    ``<name>.cut-<time>``), the file is renamed to its closed name, and the complete
    records are returned as catalog rows to index.
    """
    closed = open_path.with_name(open_path.name[: -len(OPEN_SUFFIX)])
    relpath = os.path.relpath(closed, data_dir)
    out = Indexed()
    good_end = 0
    records = 0
    with open(open_path, "rb") as f:
        try:
            for offset, length, raw in iter_members(f):
                try:
                    record, _ = parse_record(raw)
                except (ArchiveError, ValueError):
                    break
                index_record(record, relpath, offset, length, out)
                good_end = offset + length
                records += 1
        except ArchiveError:
            pass
    size = open_path.stat().st_size
    cut_file = None
    if size > good_end:
        cut_file = closed.with_name(f"{closed.name}.cut-{time.strftime('%Y%m%d%H%M%S')}")
        with open(open_path, "rb") as src, open(cut_file, "wb") as dst:
            src.seek(good_end)
            dst.write(src.read())
            dst.flush()
            os.fsync(dst.fileno())
        with open(open_path, "r+b") as f:
            f.truncate(good_end)
            os.fsync(f.fileno())
    os.rename(open_path, closed)
    fsync_dir(closed.parent)
    return Repair(closed, records, size - good_end, cut_file, out)


# -- either format -----------------------------------------------------------------------


def is_zip(path: str | os.PathLike) -> bool:
    """Whether an archive file is a zip of bodies (ARCHIVE_FORMAT=zip) rather than a WARC."""
    name = os.fspath(path)
    if name.endswith(OPEN_SUFFIX):
        name = name[: -len(OPEN_SUFFIX)]
    return name.endswith(".zip")


def read_any(path: str | os.PathLike, offset: int, length: int) -> StoredRecord:
    """:func:`read_record` for a WARC, or the zip reader for a zip of bodies."""
    if is_zip(path):
        from crawler.ziparchive import read_zip_record

        return read_zip_record(path, offset, length)
    return read_record(path, offset, length)


def index_any(path: Path, data_dir: Path, relpath: str | None = None) -> Indexed:
    """:func:`index_file` for either format."""
    if is_zip(path):
        from crawler.ziparchive import index_zip_file

        return index_zip_file(path, data_dir, relpath)
    return index_file(path, data_dir, relpath)
