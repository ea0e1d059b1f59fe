"""Link extraction for depth crawls: ways to get a page's ``<a href>`` values.

    python -m benchmarks.bench_links [--rounds 200] [--page-bytes 50000]

Each way runs on the tree of the response's own selector (built once, as a crawl
builds it once per page), so the figures are the extraction alone; "parse" is what
building that tree costs, for scale. Every way must give the same links.
"""

from __future__ import annotations

import argparse
import time

from lxml import etree
from lxml.html import iterlinks
from scrapy.http import HtmlResponse

from crawler.helptext import ToolHelpFormatter
from demo.site import DemoSite

_HREFS = etree.XPath("//a/@href", smart_strings=False)


def by_iterlinks(response: HtmlResponse) -> list[str]:
    root = response.selector.root
    return [link for el, attr, link, _ in iterlinks(root) if el.tag == "a" and attr == "href"]


def by_xpath(response: HtmlResponse) -> list[str]:
    return _HREFS(response.selector.root)


def by_css(response: HtmlResponse) -> list[str]:
    return response.css("a::attr(href)").getall()


WAYS = {"lxml iterlinks": by_iterlinks, "compiled XPath": by_xpath, "parsel css": by_css}


def page(page_bytes: int) -> HtmlResponse:
    site = DemoSite(page_bytes=page_bytes)
    site.base_url = "http://127.0.0.1:8000"
    body = site.page_html(100)  # a page with every kind of link of the demo site
    return HtmlResponse("http://127.0.0.1:8000/page/100.html", body=body, encoding="utf-8")


def timed(fn, response: HtmlResponse, rounds: int, repeats: int = 5) -> float:
    """Milliseconds per call, the best of ``repeats`` (the machine is shared)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            fn(response)
        best = min(best, (time.perf_counter() - start) / rounds * 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--page-bytes", type=int, default=50_000)
    args = parser.parse_args()
    response = page(args.page_bytes)
    expected = sorted(by_css(response))
    for name, fn in WAYS.items():
        assert sorted(fn(response)) == expected, f"{name} gives other links"

    def parse(response: HtmlResponse) -> None:
        fresh = response.replace(body=response.body)
        fresh.selector.root  # noqa: B018 - building the tree is what is timed

    parse_ms = timed(parse, response, args.rounds)
    print(f"{len(response.body):,}-byte page, {len(expected)} links, {args.rounds} rounds")
    print(f"{'parse (for scale)':<20} {parse_ms:8.3f} ms")
    for name, fn in WAYS.items():
        print(f"{name:<20} {timed(fn, response, args.rounds):8.3f} ms")


if __name__ == "__main__":
    main()
