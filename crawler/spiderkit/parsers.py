"""Parsers shared by the project's spiders (plain functions of a response)."""

from __future__ import annotations

from lxml import etree
from scrapy.http import HtmlResponse, TextResponse

from crawler.items import PageSummary

# Straight on lxml: through parsel, wrapping each of a page's text nodes in a Selector
# made the summary cost several times as much (the history of docs/benchmarks.md).
_BODY_TEXT = etree.XPath("//body//text()[not(ancestor::script)]", smart_strings=False)
_LINKS = etree.XPath("count(//a[@href])")
# What response.css("a::attr(href)") asks, compiled once: the cheapest of the ways
# measured (the history of docs/benchmarks.md, link extraction).
_HREFS = etree.XPath("descendant-or-self::a/@href", smart_strings=False)


def listed_url(response) -> str:
    """The URL as listed (before redirects): the catalog's ``url`` column."""
    request = response.request
    if request is None:
        return response.url
    return request.meta.get("catalog_url", request.url)


def hrefs(response: TextResponse) -> list[str]:
    """The ``href`` of every ``<a>`` of a page, in document order, unjoined.

    On the response's own tree, so a page whose summary is also made is parsed once.
    """
    return _HREFS(response.selector.root)


def page_summary(response: HtmlResponse) -> PageSummary:
    """The summary item of an HTML page (the ``site`` spider's default output)."""
    title = response.css("title::text").get()
    root = response.selector.root
    # Joined as they are: split() drops what strip() would, without a call per text
    # node (a 50 KB page has a thousand; stripping each was half of the summary).
    text = " ".join(_BODY_TEXT(root))
    return PageSummary(
        url=listed_url(response),
        final_url=response.url,
        status=response.status,
        title=title.strip() if title else None,
        description=response.xpath("//meta[@name='description']/@content").get(),
        language=response.xpath("/html/@lang").get(),
        links=int(_LINKS(root)),
        text_length=len(" ".join(text.split())),
    )
