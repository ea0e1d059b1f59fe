"""The shared checks of tests/checks.py fail on damage they must not forgive."""

from __future__ import annotations

import shutil

import pytest

from tests.checks import catalog_rows, response_records
from tests.crawls import crawl_site
from tests.crawls import crawled as crawled_now


@pytest.fixture
def crawled(site, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in (120, 121, 122)]
    crawled_now(crawl_site(urls, data_dir))
    rows = sorted(catalog_rows(data_dir).values(), key=lambda r: r.offset)
    assert len(rows) == 3 and len({r.archive for r in rows}) == 1
    assert response_records(data_dir) == {r.key: 1 for r in rows}
    return data_dir, rows


def test_a_corrupt_closed_archive_is_an_error(crawled):
    data_dir, rows = crawled
    middle = rows[1]
    with open(data_dir / middle.archive, "r+b") as f:
        f.seek(middle.offset + middle.length // 2)
        f.write(b"\xff" * 64)
    with pytest.raises(Exception, match=f"offset {middle.offset}"):
        response_records(data_dir)


def test_a_torn_tail_of_an_open_archive_is_forgiven(crawled, tmp_path):
    data_dir, rows = crawled
    last = rows[-1]
    closed = data_dir / last.archive
    torn = closed.with_name(closed.name + ".open")
    shutil.move(closed, torn)
    with open(torn, "r+b") as f:
        f.truncate(last.offset + last.length // 2)
    assert response_records(data_dir) == {r.key: 1 for r in rows[:-1]}
