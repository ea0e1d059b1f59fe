"""Sets and maps whose keys move to a temporary SQLite file past a bound
(crawler/spillset.py): the answers stay exact wherever a key is kept, and a depth crawl
whose list domains moved there still follows links to them, and only to them."""

from __future__ import annotations

from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.spillset import SpillingMap, SpillingSet
from spiders.site import SiteSpider
from tests.crawls import crawl_site
from tests.rawserver import RawServer, response


def _error(action, exc):
    return OSError(f"{action}: {exc}")


def test_keys_moved_to_the_file_are_still_members_and_others_are_not():
    for kind in (str, bytes):
        keys = [kind(f"example-{n}.org", "ascii") if kind is bytes else f"example-{n}.org"
                for n in range(5000)]  # fmt: skip
        held = SpillingSet(100, 1, _error, recent=10)
        for key in keys:
            held.add(key)
            held.add(key)  # once only
        assert len(held) == 5000
        assert len(held._items) < 100  # the rest went to the file
        assert all(key in held for key in keys)
        assert all(key in held for key in keys)  # again, past the recent answers' bound
        others = [k + (b"x" if kind is bytes else "x") for k in keys]
        assert not any(other in held for other in others)
        held.close()
        assert len(held) == 0 and keys[0] not in held


def test_values_moved_to_the_file_come_back_and_a_value_set_again_wins():
    urls = [f"https://example-{n}.org/page" for n in range(5000)]
    depths = SpillingMap(100, 1, _error, recent=10)
    for n, url in enumerate(urls):
        depths[url] = n % 3 + 1
    assert len(depths._items) < 100  # the rest went to the file
    for _ in range(2):  # again, past the recent answers' bound
        assert [depths.get(url) for url in urls] == [n % 3 + 1 for n in range(5000)]
    assert depths.get(urls[0] + "x") is None and depths.get(urls[0] + "x", 7) == 7
    # Lower again while in the file (and among the recent answers): the new value, from
    # memory, then from the file once it moved there too.
    for url in urls[:150]:
        depths[url] = 0
    assert all(depths.get(url) == 0 for url in urls[:150])
    assert depths.get(urls[150]) == 150 % 3 + 1
    depths.close()
    assert depths.get(urls[0]) is None


def page(*links: str) -> bytes:
    body = "".join(f"<a href='{link}'>{link}</a>" for link in links)
    return response(
        headers=[(b"Content-Type", b"text/html")], body=f"<html><body>{body}</body></html>".encode()
    )


@deferred_f_from_coro_f
async def test_a_depth_crawl_whose_list_domains_moved_to_a_file_follows_the_same_links(
    data_dir, monkeypatch
):
    server = RawServer({})
    other = server.url("/elsewhere").replace("127.0.0.1", "localhost")
    server.answers.update({"/a": page("/b", other), "/b": page(), "/elsewhere": page()})
    # Every domain of the list moved to the file as it is added.
    monkeypatch.setattr(SiteSpider, "domains_in_memory", 1)
    await crawl_site([server.url("/a")], data_dir, {"ROBOTSTXT_OBEY": "0"}, depth="1")
    assert server.counts["/a"] == 1 and server.counts["/b"] == 1
    assert server.counts["/elsewhere"] == 0  # localhost: not a domain of the list
