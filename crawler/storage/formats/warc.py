"""WARC archives (``ARCHIVE_FORMAT=warc``): one gzip member per record, random access
by offset.

Each fetch becomes a ``response`` record (its offset and length go to the catalog) and
a ``request`` record; a rendered page adds a ``conversion`` record (the DOM), which
gets the row; a 304 revalidation becomes a ``revisit`` record, and so does a payload
the archive holds already (profile identical-payload-digest, referring to the record
that holds it, where the row keeps pointing). Response records carry
the request's key, URL and method, so that the archive alone can rebuild the catalog.
Records are read with FastWARC, the fastest reader measured here (the history of
docs/benchmarks.md).

Longer than the project's other modules on purpose: a format is one module (writer,
reader, indexer, repair), so that adding one touches the registry and one new file.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import zlib
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from isal import isal_zlib
from warcio.warcwriter import WARCWriter

from crawler.storage.errors import ArchiveError, TruncatedRecordError
from crawler.storage.formats.base import (
    ArchiveFormat,
    ArchiveWriter,
    Repair,
    Scan,
    closed_name,
    finish_repair,
    gzip_member,
    iter_members,
    save_tail,
)
from crawler.storage.records import (
    DOWNLOAD_HEADER,
    IDENTICAL_PROFILE,
    KEY_HEADER,
    METHOD_HEADER,
    REFERS_TO_HEADER,
    REQUESTED_URI_HEADER,
    Fetch,
    Headers,
    Hop,
    Indexed,
    Row,
    StoredRecord,
    b32_digest,
    fetch_row,
    header,
    payload_digest,
    payload_headers,
    refers_to,
    revisit_row,
    warc_date,
)

# A rendered page (middlewares/render.py): its response record says a conversion record
# (the DOM the browser rendered) follows; the conversion record carries the status and
# validators of the response, and gets the catalog row.
RENDERED_HEADER = "X-Crawl-Rendered"
STATUS_HEADER = "X-Crawl-Status"
ETAG_HEADER = "X-Crawl-ETag"
LAST_MODIFIED_HEADER = "X-Crawl-Last-Modified"
REVISIT_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
_GZIP_MAGIC = b"\x1f\x8b\x08"

if TYPE_CHECKING:
    from fastwarc.warc import WarcRecord


# -- writing ------------------------------------------------------------------------------


class WarcWriter(ArchiveWriter):
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
        return self._write(member), len(member)

    def write_fetch(self, fetch: Fetch, digest: str | None = None) -> Row:
        """Write the response and request records of a fetch; returns its catalog row."""
        if self._file is None:
            self._open()
        for hop in fetch.redirects:
            self._write_hop(hop)
        date = warc_date(fetch.fetched_at)
        body = fetch.body
        http_headers = http_block(
            status_line(fetch.status),
            payload_headers(fetch.response_headers, len(body)),
        )
        record_id = make_warc_id()
        digest = digest or payload_digest(body)
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
                *([] if fetch.parsed else [(DOWNLOAD_HEADER, "1")]),
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
        return fetch_row(fetch, self.relpath, offset, length, digest)

    def _write_hop(self, hop: Hop) -> None:
        """A followed redirect as its own response and request records. They carry no
        X-Crawl-Key: the key's row points at the final answer, and indexing the
        archive (rebuild, repair) skips them as it skips any record without one."""
        date = warc_date(hop.fetched_at)
        http_headers = http_block(
            status_line(hop.status),
            payload_headers(hop.headers, len(hop.body)),
        )
        record_id = make_warc_id()
        self._append(
            warc_record(
                "response",
                record_id,
                [("WARC-Date", date), ("WARC-Target-URI", hop.url)],
                http_headers,
                hop.body,
                digest=payload_digest(hop.body),
            )
        )
        self._append(
            self._request_record_of(
                hop.url, hop.method, hop.request_headers, hop.request_body, date, record_id
            )
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
        return fetch_row(fetch, self.relpath, offset, length, digest, rendered=True)

    def _request_record(self, fetch: Fetch, date: str, concurrent_to: str) -> list:
        return self._request_record_of(
            fetch.final_url,
            fetch.method,
            fetch.request_headers,
            fetch.request_body,
            date,
            concurrent_to,
        )

    def _request_record_of(
        self,
        url: str,
        method: str,
        request_headers: Headers,
        body: bytes,
        date: str,
        concurrent_to: str,
    ) -> list:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = list(request_headers)
        if header(headers, "Host") is None:
            headers.insert(0, ("Host", parts.netloc))
        http_headers = http_block(f"{method} {target} HTTP/1.1", headers)
        return warc_record(
            "request",
            make_warc_id(),
            [
                ("WARC-Date", date),
                ("WARC-Target-URI", url),
                ("WARC-Concurrent-To", concurrent_to),
            ],
            http_headers,
            body,
            digest=payload_digest(body),
        )

    def write_revisit(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        """Record a 304 answer: the stored body is still current."""
        if self._file is None:
            self._open()
        http_headers = http_block(
            status_line(fetch.status),
            payload_headers(fetch.response_headers, 0),
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

    def write_unchanged(self, fetch: Fetch, original: Row) -> Row:
        """A fetch whose payload ``original``'s record holds: a revisit record of the
        identical-payload-digest profile (its HTTP headers, no payload) and the
        request record, which replay tools resolve to ``original``'s payload."""
        if self._file is None:
            self._open()
        for hop in fetch.redirects:
            self._write_hop(hop)
        date = warc_date(fetch.fetched_at)
        http_headers = http_block(
            status_line(fetch.status),
            payload_headers(fetch.response_headers, len(fetch.body)),
        )
        record_id = make_warc_id()
        warc_headers = [
            ("WARC-Date", date),
            ("WARC-Target-URI", fetch.final_url),
            ("WARC-Profile", IDENTICAL_PROFILE),
            ("WARC-Refers-To-Target-URI", original.final_url),
            ("WARC-Refers-To-Date", original.fetched_at),
            (KEY_HEADER, fetch.key),
            (REQUESTED_URI_HEADER, fetch.url),
            (METHOD_HEADER, fetch.method),
            (REFERS_TO_HEADER, refers_to(original)),
            *([] if fetch.parsed else [(DOWNLOAD_HEADER, "1")]),
        ]
        digest = original.payload_digest
        self._append(warc_record("revisit", record_id, warc_headers, http_headers, b"", digest))
        self._append(self._request_record(fetch, date, record_id))
        self.records_written += 1
        return fetch_row(fetch, original.archive, original.offset, original.length, digest)


def make_warc_id() -> str:
    """A record id as warcio writes it, ``<urn:uuid:...>`` of a random (version 4)
    UUID, formatted here: ``uuid.uuid4()`` and its ``str`` cost several times more,
    and every stored page takes two."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"<urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}>"


_MSGTYPE = {
    "response": "application/http; msgtype=response",
    "revisit": "application/http; msgtype=response",
    "request": "application/http; msgtype=request",
}


def warc_record(
    rec_type: str,
    record_id: str,
    headers: Headers,
    http: bytes | None,
    payload,
    digest: str | None = None,
    content_type: str | None = None,
) -> list:
    """A WARC/1.1 record as the list of its parts (header block, HTTP headers, payload,
    end), as warcio's ``WARCWriter`` serialises it; ``http``: the HTTP header block
    (:func:`http_block`), None for a record without one.

    The digests are computed here in one pass each: warcio's writer would re-read the
    payload in 16 KiB chunks to compute them, and build every record through several
    header rewrites, which together cost as much as compressing the record.
    """
    http_block = http or b""
    block = hashlib.sha1(http_block)
    block.update(payload)
    warc_headers = [("WARC-Type", rec_type), ("WARC-Record-ID", record_id), *headers]
    if digest:
        warc_headers.append(("WARC-Payload-Digest", digest))
    warc_headers += [
        ("WARC-Block-Digest", "sha1:" + _b32(block.digest())),
        ("Content-Type", content_type or _MSGTYPE[rec_type]),
        ("Content-Length", str(len(http_block) + len(payload))),
    ]
    return [warc_head(warc_headers), http_block, payload, b"\r\n\r\n"]


def warc_head(headers: Headers) -> bytes:
    """The WARC header block: what ``StatusAndHeaders("", headers,
    protocol="WARC/1.1").to_bytes()`` writes, without its copy and conversion of
    every header (the values here are text already)."""
    return "\r\n".join(["WARC/1.1", *[f"{k}: {v}" for k, v in headers], "", ""]).encode("utf-8")


def status_line(status: int) -> str:
    """A response's status line as warcio writes it: ``HTTP/1.1 200 OK``."""
    return f"HTTP/1.1 {status} {_reason(status)}"


def http_block(first_line: str, headers: Headers) -> bytes:
    """The HTTP header block as the bytes that came over the wire: what warcio's
    ``StatusAndHeaders(...).to_str()`` gives, and the blank line, built at once (the
    class copies every header and concatenates a string per line, twice per page).

    Header names and values are held as the wire's bytes read as latin-1, so encoding
    them as latin-1 gives those bytes back, as warcio writes the headers it captures
    itself. (Its ``to_ascii_bytes`` would percent-encode every non-ASCII value.) A line
    holding a character latin-1 cannot encode never came over the wire as bytes (a
    header a browser reported): it is written as UTF-8.
    """
    text = "\r\n".join([first_line, *[f"{k}: {v}" for k, v in headers], "", ""])
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(_line_bytes(line) for line in text.splitlines(keepends=True))


def _line_bytes(line: str) -> bytes:
    try:
        return line.encode("latin-1")
    except UnicodeEncodeError:
        return line.encode("utf-8")


def _b32(digest: bytes) -> str:
    return b32_digest(digest)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


# -- reading ------------------------------------------------------------------------------


def parse_record(raw: bytes, where: str) -> WarcRecord:
    """One uncompressed WARC record, its HTTP headers parsed (FastWARC)."""
    # Imported at the first read: the writer process, and a crawl that replays nothing,
    # never read a record, and would carry the library's memory for nothing.
    from fastwarc.warc import WarcRecord

    if not raw.startswith(b"WARC/"):
        raise ArchiveError(f"{where}: not a WARC record")
    try:
        record = WarcRecord.from_bytes(raw)
        record.parse_http()
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"{where}: not a WARC record ({exc})") from exc
    return record


def stored_record(record: WarcRecord, where: str) -> StoredRecord:
    """The answer a response, revisit or conversion record holds, as the crawl saw it."""
    headers = record.headers
    warc_headers = list(headers.astuples())
    if headers.get("WARC-Type") == "conversion":
        # A rendered page as the spider saw it: the response's status, the DOM as body.
        return StoredRecord(
            url=headers.get("WARC-Target-URI"),
            status=int(headers.get(STATUS_HEADER) or 200),
            headers=[("Content-Type", headers.get("Content-Type") or "text/html")],
            body=record.reader.read(),
            warc_headers=warc_headers,
        )
    http = record.http_headers
    if http is None:
        raise ArchiveError(f"{where}: record has no HTTP headers")
    return StoredRecord(
        url=headers.get("WARC-Target-URI"),
        status=http.status_code,
        # As the crawl holds them: the wire's bytes read as latin-1 (FastWARC's own
        # decoding is cp1252, which would not give the bytes back).
        headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in http.items_bytes()],
        body=record.reader.read(),
        warc_headers=warc_headers,
    )


def decode(data: bytes, path: str | os.PathLike, offset: int) -> StoredRecord:
    """The stored answer in one gzip member of a WARC, read at ``offset``."""
    where = f"{path}: offset {offset}"
    try:
        # ISA-L inflates in half the time of zlib, checking the CRC and length the same.
        raw = isal_zlib.decompress(data, 31)
    except (isal_zlib.error, zlib.error) as exc:
        kind = TruncatedRecordError if "incomplete" in str(exc) else ArchiveError
        raise kind(f"{where}: corrupt or truncated gzip member ({exc})") from exc
    return stored_record(parse_record(raw, where), where)


def index_record(record: WarcRecord, relpath: str, offset: int, length: int, out: Indexed) -> None:
    """Add what one parsed record says about the catalog to ``out``."""
    rec = record.headers
    key = rec.get(KEY_HEADER)
    if not key:
        return
    rec_type = rec.get("WARC-Type")
    if rec_type == "revisit":
        http = record.http_headers
        headers = list(http.astuples())
        etag, last_modified = header(headers, "ETag"), header(headers, "Last-Modified")
        if rec.get("WARC-Profile") != IDENTICAL_PROFILE or not rec.get(REFERS_TO_HEADER):
            out.touches.append((key, etag, last_modified, rec.get("WARC-Date")))
            return
        fields = {
            "key": key,
            "url": rec.get(REQUESTED_URI_HEADER) or rec.get("WARC-Target-URI"),
            "final_url": rec.get("WARC-Target-URI"),
            "method": rec.get(METHOD_HEADER),
            "status": http.status_code,
            "fetched_at": rec.get("WARC-Date"),
            "digest": rec.get("WARC-Payload-Digest"),
            "refers_to": rec.get(REFERS_TO_HEADER),
        }
        out.add(revisit_row(fields, headers), bool(rec.get(DOWNLOAD_HEADER)))
        return
    if rec_type == "conversion":
        # The DOM a browser rendered: the response's status and validators are on the
        # record itself.
        described = {
            "status": int(rec.get(STATUS_HEADER) or 200),
            "content_type": rec.get("Content-Type"),
            "bytes": int(rec.get("Content-Length") or 0),
            "etag": rec.get(ETAG_HEADER),
            "last_modified": rec.get(LAST_MODIFIED_HEADER),
            "rendered": 1,
        }
    elif rec_type == "response" and not rec.get(RENDERED_HEADER):
        # (A rendered page's row points at its conversion record, written next.)
        http = record.http_headers
        headers = list(http.astuples())
        described = {
            "status": http.status_code,
            "content_type": header(headers, "Content-Type"),
            "bytes": int(header(headers, "Content-Length") or 0),
            "etag": header(headers, "ETag"),
            "last_modified": header(headers, "Last-Modified"),
        }
    else:
        return
    row = Row(
        key=key,
        url=rec.get(REQUESTED_URI_HEADER) or rec.get("WARC-Target-URI"),
        final_url=rec.get("WARC-Target-URI"),
        fetched_at=rec.get("WARC-Date"),
        archive=relpath,
        offset=offset,
        length=length,
        payload_digest=rec.get("WARC-Payload-Digest"),
        method=rec.get(METHOD_HEADER) or "GET",
        **described,
    )
    out.add(row, bool(rec.get(DOWNLOAD_HEADER)))


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


class WarcFormat(ArchiveFormat):
    name = "warc"
    suffix = WarcWriter.suffix
    keeps_rendered = True

    def writer(self, directory, data_dir, **options) -> WarcWriter:
        return WarcWriter(directory, data_dir, **options)

    def decode(self, data: bytes, path, offset: int) -> StoredRecord:
        return decode(data, path, offset)

    def index(self, path: Path, data_dir: Path, relpath: str | None = None) -> Indexed:
        relpath = relpath or os.path.relpath(path, data_dir)
        out = Indexed()
        with open(path, "rb") as f:
            for offset, length, raw in iter_members(f):
                record = parse_record(raw, f"{path}: offset {offset}")
                index_record(record, relpath, offset, length, out)
        return out

    def scan(self, path: Path, relpath: str, scan: Scan) -> None:
        size = path.stat().st_size
        start = 0
        with open(path, "rb") as f:
            while start < size:
                pos = start
                try:
                    for offset, length, raw in iter_members(f, start):
                        pos = offset + length
                        try:
                            record = parse_record(raw, f"{path}: offset {offset}")
                        except ArchiveError as exc:
                            scan.problems.append(str(exc))
                            continue
                        index_record(record, relpath, offset, length, scan.indexed)
                        scan.records += 1
                    return
                except ArchiveError as exc:
                    scan.problems.append(f"{path}: {exc}; skipped to the next record")
                    if isinstance(exc, TruncatedRecordError):
                        scan.cut.append(path)
                    start = _next_member(f, pos + 1)
                    if start < 0:
                        return

    def repair(self, path: Path, data_dir: Path) -> Repair:
        """The partial trailing record is cut off and kept beside the file as
        ``<name>.cut-<time>``; the complete records are returned as rows to index."""
        closed = closed_name(path)
        relpath = os.path.relpath(closed, data_dir)
        out = Indexed()
        good_end = records = 0
        with open(path, "r+b") as f:
            try:
                for offset, length, raw in iter_members(f):
                    try:
                        record = parse_record(raw, f"{path}: offset {offset}")
                    except ArchiveError:
                        break
                    index_record(record, relpath, offset, length, out)
                    good_end = offset + length
                    records += 1
            except ArchiveError:
                pass
            size = f.seek(0, os.SEEK_END)
            cut_file = None
            if size > good_end:
                cut_file = save_tail(f, good_end, closed)
                f.truncate(good_end)
                os.fsync(f.fileno())
        finish_repair(path, closed)
        return Repair(closed, records, size - good_end, cut_file, out)


FORMAT = WarcFormat()
