"""Responses rebuilt from stored records: the class Scrapy would choose, the headers
as they came."""

from __future__ import annotations

from scrapy.http import Headers
from scrapy.responsetypes import responsetypes

from crawler.reparse.responses import build_response, wire
from crawler.storage.records import StoredRecord

HTML = b"<!DOCTYPE html><html><head><title>t</title></head><body><p>x</p></body></html>"
RECORDS = [
    # No Content-Type: the URL, then the body decide, for each response.
    ("http://x.test/a.html", [], b"\x00\x01binary"),
    ("http://x.test/feed.xml", [], b"<?xml version='1.0'?><r/>"),
    ("http://x.test/page", [], HTML),
    ("http://x.test/blob", [], b"\x00\x01\x02\x03"),
    # A compressed body: Scrapy gives a plain Response, whatever the type says.
    ("http://x.test/z", [("Content-Type", "text/html"), ("Content-Encoding", "gzip")], b"\x1f"),
    ("http://x.test/z.html", [("Content-Type", "text/html")], HTML),
    # Given twice, the last value counts.
    ("http://x.test/two", [("Content-Type", "text/plain"), ("content-type", "text/html")], HTML),
    ("http://x.test/two", [("Content-Type", "text/html"), ("content-type", "text/plain")], HTML),
    ("http://x.test/d", [("Content-Disposition", 'attachment; filename="a.xml"')], b"<r/>"),
    ("http://x.test/d", [("Content-Disposition", 'attachment; filename="a.bin"')], b"\x00"),
    ("http://x.test/l", [("Content-Type", "text/html; charset=latin-1"), ("X-N", "caf\xe9")], HTML),
]


def test_the_class_scrapy_chooses_and_the_headers_sent():
    # Twice over: the second time, whatever was kept from the first answers.
    for _ in range(2):
        for url, headers, body in RECORDS:
            stored = StoredRecord(url=url, status=200, headers=headers, body=body, warc_headers=[])
            got = build_response(stored, request=None)
            sent = Headers([(wire(n), wire(v)) for n, v in headers])
            expected = responsetypes.from_args(headers=sent, url=url, body=body)
            assert type(got) is expected, (url, headers)
            assert {k: got.headers.getlist(k) for k in sent} == {k: sent.getlist(k) for k in sent}
            assert got.body == body and got.url == url
