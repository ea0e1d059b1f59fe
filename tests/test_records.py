"""Records hold what the server sent: header bytes, redirects."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
import zipfile
import zlib
from collections import Counter
from datetime import UTC, datetime

from scrapy.utils.defer import deferred_f_from_coro_f
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders

from crawler.reparse.responses import build_response
from crawler.storage.datadir import DataDir
from crawler.storage.formats.warc import http_block, make_warc_id, status_line
from crawler.storage.keys import request_key
from crawler.storage.records import payload_digest, warc_date
from crawler.storage.store import Store, StoreConfig
from crawler.tools.wacz import WaczBuilder
from tests.checks import catalog_rows, response_records
from tests.conftest import ROOT
from tests.crawls import crawl_site
from tests.factories import fetch
from tests.rawserver import RawServer, response

BIN = ROOT / ".venv" / "bin"
SENT = [
    (b"Content-Type", b"text/html; charset=utf-8"),
    (b"X-Latin", b"caf\xe9 na\xefve \xff\xfe"),
    (b"X-Utf8", b"caf\xc3\xa9 \xe2\x82\xac"),
    (b"Last-Modified", b"Tue, 14 Nov 2023 22:13:20 GMT"),
    (b"Content-Disposition", b'inline; filename="r\xe9sum\xe9.html"'),
]


def as_warcio_reads(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


@deferred_f_from_coro_f
async def test_header_bytes_are_stored_as_they_came(data_dir):
    server = RawServer({"/h": response(headers=SENT, body=b"<p>body</p>")})
    await crawl_site([server.url("/h")], data_dir, {"ROBOTSTXT_OBEY": "0"})
    [row] = catalog_rows(data_dir).values()
    datadir = DataDir(data_dir)
    path = datadir.resolve(row.archive)
    with open(path, "rb") as f:
        f.seek(row.offset)
        raw = zlib.decompress(f.read(row.length), 31)
    for name, value in SENT:
        assert b"\r\n" + name + b": " + value + b"\r\n" in raw
    # warcio reads them back (UTF-8 where they are, else latin-1), and its checker
    # finds the digests right.
    with open(path, "rb") as f:
        [record] = [r for r in ArchiveIterator(f) if r.rec_type == "response"]
        got = dict(record.http_headers.headers)
    assert all(got[name.decode()] == as_warcio_reads(value) for name, value in SENT)
    check = subprocess.run(
        [sys.executable, "-m", "warcio.cli", "check", str(path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # A replayed response has the bytes the crawl saw.
    replayed = build_response(datadir.read(row), request=None)
    assert {name: replayed.headers.getlist(name) for name, _ in SENT} == {
        name: [value] for name, value in SENT
    }


@deferred_f_from_coro_f
async def test_each_followed_redirect_is_its_own_response_record(site, tmp_path, data_dir):
    base = site.base_url
    listed = [f"{base}/redirect/7", f"{base}/page/7.html", f"{base}/redirect/8"]
    await crawl_site(listed, data_dir)
    rows = {row.url: row for row in catalog_rows(data_dir).values()}
    # The row stays keyed on the listed URL and points at the final answer.
    assert rows[f"{base}/redirect/7"].final_url == f"{base}/page/7.html"
    assert rows[f"{base}/redirect/7"].status == 200
    assert response_records(data_dir) == Counter({row.key: 1 for row in rows.values()})
    archives = sorted(str(p) for p in DataDir(data_dir).archives())
    check = subprocess.run(
        [sys.executable, "-m", "warcio.cli", "check", *archives], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # A replay index resolves the listed URL to the redirect, and the redirect's
    # target to the page.
    index = subprocess.run(
        [str(BIN / "cdxj-indexer"), *archives], capture_output=True, text=True, check=True
    ).stdout
    entries = [json.loads(line.split(" ", 2)[2]) for line in index.splitlines()]
    responses = [e for e in entries if e.get("mime") != "warc/request"]
    by_url: dict[str, list[str]] = {}
    for entry in responses:
        by_url.setdefault(entry["url"], []).append(entry["status"])
    assert by_url[f"{base}/redirect/7"] == ["301"]
    assert by_url[f"{base}/redirect/8"] == ["301"]
    assert sorted(by_url[f"{base}/page/8.html"]) == ["200"]
    # The WACZ page list names each page once.
    out = tmp_path / "c.wacz"
    WaczBuilder(data_dir, out).run()
    with zipfile.ZipFile(out) as zf:
        pages = [json.loads(line) for line in zf.read("pages/pages.jsonl").splitlines()[1:]]
    urls = [page["url"] for page in pages]
    assert sorted(urls) == sorted({f"{base}/page/7.html", f"{base}/page/8.html"})


def test_record_dates_are_datetimes_text_to_the_microsecond():
    rng = random.Random(5)
    stamps = [rng.uniform(0, 4e9) for _ in range(50_000)]
    # Rounding to the microsecond: halves (to even), and into the next second.
    stamps += [1_700_000_000 + f for f in (0.0, 0.0000005, 0.0000015, 0.9999994, 0.9999996)]
    stamps += [1_764_567_890.123456 + n * 1e-7 for n in range(5_000)]  # within one second
    for ts in stamps:
        assert warc_date(ts) == datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_record_ids_are_random_uuid_urns():
    ids = [make_warc_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for record_id in ids:
        assert record_id.startswith("<urn:uuid:") and record_id.endswith(">")
        parsed = uuid.UUID(record_id[10:-1])
        assert (str(parsed), parsed.version, parsed.variant) == (
            record_id[10:-1],
            4,
            uuid.RFC_4122,
        )


HEADER_CASES = [
    [],
    [("Content-Type", "text/html"), ("Content-Length", "12")],
    [("X-Latin", "caf\xe9 na\xefve \xff\xfe"), ("X-Odd", "a\x85b\x0bc")],
    [("X-Browser", "caf\u00e9 \u20ac"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")],
]


def test_http_blocks_are_the_bytes_warcio_would_write():
    for headers in HEADER_CASES:
        for first, made in (
            ("HTTP/1.1 200 OK", StatusAndHeaders("200 OK", headers, protocol="HTTP/1.1")),
            ("HTTP/1.1 299 ", StatusAndHeaders("299 ", headers, protocol="HTTP/1.1")),
            ("GET /a?b=1 HTTP/1.1", StatusAndHeaders("GET /a?b=1 HTTP/1.1", headers,
                                                     is_http_request=True)),
        ):  # fmt: skip
            text = made.to_str()
            try:
                expected = text.encode("latin-1") + b"\r\n"
            except UnicodeEncodeError:
                lines = text.splitlines(keepends=True)
                expected = b"".join(_as_wire(line) for line in lines) + b"\r\n"
            assert http_block(first, headers) == expected, (first, headers)
    assert status_line(404) == "HTTP/1.1 404 Not Found"


def _as_wire(line: str) -> bytes:
    try:
        return line.encode("latin-1")
    except UnicodeEncodeError:
        return line.encode("utf-8")


def test_records_read_back_by_warcio_hold_what_was_served(tmp_path):
    served = [("Content-Type", "text/html"), ("X-Latin", "caf\xe9"), ("Set-Cookie", "a=1")]
    url = "http://example.org/page/3"
    body = b"<html>" + bytes(range(256)) * 200
    page = fetch(request_key(url), body, url=url, final_url=url, response_headers=served,
                 request_headers=[("Host", "example.org")])  # fmt: skip
    store = Store(StoreConfig(data_dir=tmp_path))
    store.put(page)
    store.close()
    [path] = DataDir(tmp_path).archives()
    with open(path, "rb") as f:
        records = [
            (r.rec_type, r.http_headers, r.content_stream().read(), dict(r.rec_headers.headers))
            for r in ArchiveIterator(f)
            if r.rec_type in ("response", "request")
        ]
    [(_, http, body, head)] = [r for r in records if r[0] == "response"]
    assert body == page.body
    assert http.statusline == "200 OK"
    assert http.headers == [*served, ("Content-Length", str(len(page.body)))]
    assert head["WARC-Payload-Digest"] == payload_digest(page.body)
    [(_, request, _, _)] = [r for r in records if r[0] == "request"]
    assert request.protocol == "GET" and request.headers == [("Host", "example.org")]
    check = subprocess.run(
        [sys.executable, "-m", "warcio.cli", "check", str(path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
