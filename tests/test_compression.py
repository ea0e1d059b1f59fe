"""ARCHIVE_COMPRESSOR and ARCHIVE_GZIP_LEVEL: each record is compressed as they say.

Compression is deterministic, so the check is exact: every gzip member of the archive
is what the named compressor at the named level makes of the record it holds, and
not what the default (ISA-L at level 1) makes of it.
"""

from __future__ import annotations

import zlib

import pytest
from isal import isal_zlib
from scrapy.exceptions import UsageError
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import assert_rows_readable
from tests.conftest import run_crawl, write_urls
from tests.crawls import OnePage, crawl, crawl_site

COMPRESSORS = {"isal": isal_zlib, "zlib": zlib}
PATHS = ["page/170.html", "page/171.html", "gzip/172", "binary/173"]


def gzip_members(path):
    """(member bytes, uncompressed bytes) of each gzip member of a file."""
    data = path.read_bytes()
    out = []
    while data:
        inflater = zlib.decompressobj(31)
        raw = inflater.decompress(data)
        size = len(data) - len(inflater.unused_data)
        out.append((data[:size], raw))
        data = inflater.unused_data
    return out


def compress(compressor: str, level: int, raw: bytes) -> bytes:
    return COMPRESSORS[compressor].compress(raw, level, 31)


@pytest.mark.parametrize(
    ("settings", "compressor", "level"),
    [
        ({}, "isal", 1),  # the default
        ({"ARCHIVE_GZIP_LEVEL": "0"}, "isal", 0),
        ({"ARCHIVE_GZIP_LEVEL": "3"}, "isal", 3),
        ({"ARCHIVE_COMPRESSOR": "zlib", "ARCHIVE_GZIP_LEVEL": "0"}, "zlib", 0),
        ({"ARCHIVE_COMPRESSOR": "zlib", "ARCHIVE_GZIP_LEVEL": "9"}, "zlib", 9),
    ],
)
@deferred_f_from_coro_f
async def test_each_record_is_compressed_as_the_settings_say(
    site, data_dir, settings, compressor, level
):
    await crawl_site([f"{site.base_url}/{p}" for p in PATHS], data_dir, settings)
    assert len(assert_rows_readable(data_dir, site)) == len(PATHS)
    (archive,) = (data_dir / "archive").glob("*.warc.gz")
    members = gzip_members(archive)
    assert len(members) == 1 + 2 * len(PATHS)  # warcinfo, then response and request each
    for member, raw in members:
        assert member == compress(compressor, level, raw)
        if (compressor, level) != ("isal", 1):
            assert member != compress("isal", 1, raw)


@pytest.mark.parametrize(
    "setting",
    [
        {"ARCHIVE_COMPRESSOR": "lzma"},
        {"ARCHIVE_GZIP_LEVEL": "4"},
        {"ARCHIVE_COMPRESSOR": "zlib", "ARCHIVE_GZIP_LEVEL": "10"},
        {"ARCHIVE_GZIP_LEVEL": "-1"},
    ],
)
@deferred_f_from_coro_f
async def test_a_bad_compressor_or_level_is_refused_before_anything_is_stored(
    site, data_dir, setting
):
    site.reset_counts()
    name = list(setting)[-1]
    with pytest.raises(UsageError, match=f"{name}(=.*)?: give|{name} is 0-3"):
        await crawl(OnePage, data_dir, setting, url=f"{site.base_url}/page/174.html")
    assert not data_dir.exists()
    assert site.counts["/page/174.html"] == 0


def test_a_bad_compressor_is_a_one_line_usage_error(site, tmp_path, data_dir):
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/174.html"])
    result = run_crawl(urls, data_dir, "-s", "ARCHIVE_COMPRESSOR=lzma")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "ARCHIVE_COMPRESSOR='lzma': give one of isal, zlib" in result.stderr
