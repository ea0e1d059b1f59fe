"""The values that cross the storage core: what was fetched, what was stored, its row.

:class:`Fetch` is what the crawl hands to the store; :class:`Row` is a row of the
catalog; :class:`StoredRecord` is what an archive gives back, whatever its format.
"""

from __future__ import annotations

import base64
import hashlib
import math
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

Headers = list[tuple[str, str]]

# Record headers naming the request a record answers, so that the catalog can be
# rebuilt from the archive alone. A stored record of any format carries them.
KEY_HEADER = "X-Crawl-Key"
REQUESTED_URI_HEADER = "X-Crawl-Requested-URI"
METHOD_HEADER = "X-Crawl-Method"
_OWN_HEADERS = {"WARC-Target-URI", KEY_HEADER, REQUESTED_URI_HEADER, METHOD_HEADER}
# A record no spider callback parses (a media pipeline's download, or a thumbnail it
# made): the recovery of a killed run indexes it as a download, never as a page whose
# items are still to parse. A WARC record says it with this header ("1"), the zip and
# sqlite formats with ``"download": 1`` in their metadata.
DOWNLOAD_HEADER = "X-Crawl-Download"
DOWNLOAD_META = "download"
# Headers that no longer describe the stored payload once Scrapy decoded it; the
# server's values are kept under this prefix (the convention replay tools know).
ORIG_PREFIX = "X-Archive-Orig-"


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
    # The redirects followed from ``url`` to ``final_url``, in order.
    redirects: list[Hop] = field(default_factory=list)
    # False: no spider callback parses it (a download of Scrapy's FilesPipeline, a
    # thumbnail), so its row is committed without waiting for the page's items.
    parsed: bool = True


@dataclass
class Hop:
    """A redirect the crawl followed on its way to a fetch's answer: the redirect
    response (archived as its own record) and the request it answered."""

    url: str
    status: int
    headers: Headers
    body: bytes
    request_headers: Headers
    fetched_at: float
    method: str = "GET"
    request_body: bytes = b""


@dataclass
class StoredRecord:
    """A stored answer as the crawl saw it; ``warc_headers`` are the record's headers
    (a zip entry's metadata is given under the same names)."""

    url: str
    status: int
    headers: Headers
    body: bytes
    warc_headers: Headers

    @property
    def key(self) -> str | None:
        return header(self.warc_headers, KEY_HEADER)

    @property
    def digest(self) -> str | None:
        """The payload digest the record states (None if it states none)."""
        return header(self.warc_headers, "WARC-Payload-Digest")


@dataclass
class Row:
    """One row of the catalog's ``artifacts`` table (docs/reference/data-directory.md)."""

    key: str
    url: str
    final_url: str
    status: int
    content_type: str | None
    bytes: int
    etag: str | None
    last_modified: str | None
    fetched_at: str
    archive: str
    offset: int
    length: int
    payload_digest: str | None
    method: str = "GET"
    # 1: the record is the DOM a browser rendered (a WARC conversion record), not the
    # server's response; see middlewares/render.py.
    rendered: int = 0


# A 304 refresh found in an archive: (key, etag, last_modified, fetched_at).
Touch = tuple[str, str | None, str | None, str]
# A revisit record of a payload stored already names the record that holds it: where
# its row points, so that the archive alone gives the row back (an archive file as the
# catalog names it, the offset and the length).
REFERS_TO_HEADER = "X-Crawl-Refers-To-Record"
IDENTICAL_PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"


@dataclass
class Indexed:
    """What an archive file holds, as catalog rows and 304 refreshes. A revisit of a
    payload stored already is a row pointing at the record that holds it. ``downloads``:
    the keys of the rows no spider callback parses (:data:`DOWNLOAD_HEADER`)."""

    rows: list[Row] = field(default_factory=list)
    touches: list[Touch] = field(default_factory=list)
    downloads: set[str] = field(default_factory=set)

    def add(self, row: Row, download: bool = False) -> None:
        self.rows.append(row)
        if download:
            self.downloads.add(row.key)


def refers_to(original: Row) -> str:
    """The value of :data:`REFERS_TO_HEADER` naming ``original``'s record."""
    return f"{original.archive} {original.offset} {original.length}"


def revisit_row(meta: dict, headers: Headers) -> Row:
    """The row a revisit of a stored payload implies, from its fields (those of
    :func:`meta_row` and ``refers_to``) and its HTTP headers, whatever the format."""
    archive, offset, length = meta["refers_to"].rsplit(" ", 2)
    return meta_row(meta, headers, archive, int(offset), int(length))


def meta_row(
    meta: dict, headers: Headers, archive: str, offset: int, length: int, size: int | None = None
) -> Row:
    """The row of a record at ``offset`` of ``archive`` from the metadata the zip and
    sqlite formats keep (``key``, ``url``, ``final_url``, ``method``, ``status``,
    ``fetched_at``, ``digest``) and its HTTP headers; the payload is ``size`` bytes
    (by default, as its Content-Length says)."""
    return Row(
        key=meta["key"],
        url=meta["url"],
        final_url=meta["final_url"],
        status=int(meta["status"]),
        content_type=header(headers, "Content-Type"),
        bytes=int(header(headers, "Content-Length") or 0) if size is None else size,
        etag=header(headers, "ETag"),
        last_modified=header(headers, "Last-Modified"),
        fetched_at=meta["fetched_at"],
        archive=archive,
        offset=offset,
        length=length,
        payload_digest=meta.get("digest"),
        method=meta.get("method") or "GET",
    )


def as_row_answer(stored: StoredRecord, row: Row) -> StoredRecord:
    """A record read for ``row`` as the answer to its own request: see
    :func:`as_answer`."""
    return as_answer(
        stored, row.key, row.url, row.final_url, row.method, row.status, row.payload_digest
    )


def as_answer(
    stored: StoredRecord,
    key: str,
    url: str,
    final_url: str,
    method: str,
    status: int,
    digest: str | None,
) -> StoredRecord:
    """A record read for the row of ``key`` as the answer to that row's request. A row
    deduplicated against another URL's identical payload (ARCHIVE_DEDUP=digest) points
    at that URL's record: the payload and headers are the record's, the URL, status
    and key the row's. A record of another key and payload is given back as it is: the
    row is wrong, and readers say so."""
    if stored.key in (None, key) or not digest or stored.digest != digest:
        return stored
    warc_headers = [(n, v) for n, v in stored.warc_headers if n not in _OWN_HEADERS]
    warc_headers += [
        ("WARC-Target-URI", final_url),
        (KEY_HEADER, key),
        (REQUESTED_URI_HEADER, url),
        (METHOD_HEADER, method),
        ("WARC-Refers-To-Target-URI", stored.url),
    ]
    return replace(stored, url=final_url, status=status, warc_headers=warc_headers)


def fetch_row(
    fetch: Fetch, archive: str, offset: int, length: int, digest: str, rendered: bool = False
) -> Row:
    """The catalog row of a stored fetch, whose record is at ``offset`` of ``archive``;
    with ``rendered``, the row of the DOM a browser rendered from it."""
    headers = fetch.response_headers
    return Row(
        key=fetch.key,
        url=fetch.url,
        final_url=fetch.final_url,
        status=fetch.status,
        content_type=fetch.rendered_type if rendered else header(headers, "Content-Type"),
        bytes=len(fetch.rendered_body if rendered else fetch.body),
        etag=header(headers, "ETag"),
        last_modified=header(headers, "Last-Modified"),
        fetched_at=warc_date(fetch.fetched_at),
        archive=archive,
        offset=offset,
        length=length,
        payload_digest=digest,
        method=fetch.method,
        rendered=int(rendered),
    )


def header(headers: Headers, name: str) -> str | None:
    """The first value of header ``name`` (any case), or None."""
    lname = name.lower()
    for k, v in headers:
        if k.lower() == lname:
            return v
    return None


# The last whole second warc_date formatted, and its text: replaced as one tuple, so
# that threads sharing it never pair a second with another one's text.
_last_second: tuple[float, str] = (-1.0, "")


def warc_date(ts: float) -> str:
    """A time as the catalog and WARC-Date write it: ISO 8601 UTC, microseconds.

    The same text as ``datetime.fromtimestamp(ts, UTC).strftime(...%fZ)`` (microseconds
    rounded half to even, as ``fromtimestamp`` does) at a fraction of the cost: the
    second is formatted once and reused (two or three dates per stored page).
    """
    global _last_second
    frac, whole = math.modf(ts)
    micro = round(frac * 1e6)
    if micro >= 1_000_000:
        whole, micro = whole + 1, micro - 1_000_000
    elif micro < 0:
        whole, micro = whole - 1, micro + 1_000_000
    second, text = _last_second
    if second != whole:
        text = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _last_second = (whole, text)
    return f"{text}{micro:06d}Z"


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# Two base32 letters for each 10 bits: a SHA-1 digest (160 bits) is 16 look-ups.
_B32_PAIRS = [a + b for a in _B32 for b in _B32]
_B32_SHIFTS = tuple(range(150, -1, -10))


def b32_digest(digest: bytes) -> str:
    """``base64.b32encode(digest)`` as text, for a SHA-1 digest without the stdlib's
    per-call Python loop (two per record, a visible share of a small record's cost)."""
    if len(digest) != 20:
        return base64.b32encode(digest).decode("ascii")
    n = int.from_bytes(digest, "big")
    pairs = _B32_PAIRS
    return "".join([pairs[(n >> s) & 1023] for s in _B32_SHIFTS])


def payload_digest(data) -> str:
    """The digest WARC records carry: ``sha1:`` and base32."""
    if not data:
        return EMPTY_DIGEST
    return "sha1:" + b32_digest(hashlib.sha1(data).digest())


EMPTY_DIGEST = "sha1:" + base64.b32encode(hashlib.sha1(b"").digest()).decode("ascii")


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
