"""Records hold what the server sent: header bytes, redirects."""

from __future__ import annotations

import subprocess
import sys
import zlib

from warcio.archiveiterator import ArchiveIterator

from crawler.reparse.responses import build_response
from crawler.storage.datadir import DataDir
from tests.checks import catalog_rows
from tests.conftest import run_crawl, write_urls
from tests.rawserver import RawServer, response

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


def test_header_bytes_are_stored_as_they_came(tmp_path, data_dir):
    server = RawServer({"/h": response(headers=SENT, body=b"<p>body</p>")})
    urls = write_urls(tmp_path / "u.txt", [server.url("/h")])
    assert run_crawl(urls, data_dir, "-s", "ROBOTSTXT_OBEY=0").returncode == 0
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
