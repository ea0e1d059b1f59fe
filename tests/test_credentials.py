"""Request records never hold ``Authorization`` or ``Proxy-Authorization``.

A real crawl sends both (HTTP auth to the site, basic auth to a real tinyproxy), the
site and the proxy see them, and the stored files do not.
"""

from __future__ import annotations

import base64
import gzip
import textwrap
from urllib.parse import urlsplit

from warcio.archiveiterator import ArchiveIterator

from tests.checks import rows_by_url
from tests.cmdline import run_scrapy
from tests.proxy_servers import PROXY_PASSWORD, PROXY_USER, proxy_pool  # noqa: F401

SITE_USER, SITE_PASSWORD = "reader", "s1te-pa55-7c1e"

SPIDER = """
    import scrapy

    class PrivateSpider(scrapy.Spider):
        name = "private"
        custom_settings = {{
            "HTTPAUTH_USER": {user!r},
            "HTTPAUTH_PASS": {password!r},
            "HTTPAUTH_DOMAIN": {domain!r},
        }}

        def __init__(self, base, proxy, **kwargs):
            super().__init__(**kwargs)
            self.base, self.proxy = base, proxy

        async def start(self):
            yield scrapy.Request(self.base + "/page/130.html")
            yield scrapy.Request(self.base + "/page/131.html", meta={{"proxy": self.proxy}})

        def parse(self, response):
            yield {{"url": response.url}}
"""


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_request_records_hold_no_credentials(site, tmp_path, data_dir, proxy_pool):  # noqa: F811
    spider = tmp_path / "private.py"
    source = SPIDER.format(
        user=SITE_USER, password=SITE_PASSWORD, domain=urlsplit(site.base_url).netloc
    )
    spider.write_text(textwrap.dedent(source))
    proxy = proxy_pool["proxy-auth"]
    proxy.mark()
    site.reset_counts()
    result = run_scrapy(
        "runspider", str(spider), "-a", f"base={site.base_url}", "-a", f"proxy={proxy.url}",
        "-s", f"DATA_DIR={data_dir}", "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "ROBOTSTXT_OBEY=0",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    urls = [f"{site.base_url}/page/{n}.html" for n in (130, 131)]
    assert {u: r.status for u, r in rows_by_url(data_dir).items()} == dict.fromkeys(urls, 200)
    # Both were sent: the site got the Authorization header, and the proxy, which
    # answers 407 without Proxy-Authorization, forwarded the second page.
    for n in (130, 131):
        assert site.request_headers[f"/page/{n}.html"]["Authorization"] == basic(
            SITE_USER, SITE_PASSWORD
        )
    assert ["/page/131.html" in line for line in proxy.requests_since_mark()] == [True]

    secrets = [SITE_PASSWORD, PROXY_PASSWORD, basic(SITE_USER, SITE_PASSWORD)[6:]]
    secrets.append(basic(PROXY_USER, PROXY_PASSWORD)[6:])
    requests = 0
    for path in sorted((data_dir / "archive").glob("*.warc.gz")):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                if record.rec_type == "request":
                    requests += 1
                    names = {name.lower() for name, _ in record.http_headers.headers}
                    assert "user-agent" in names
                    assert not names & {"authorization", "proxy-authorization"}, names
        raw = gzip.decompress(path.read_bytes()).decode("latin-1")
        assert not [s for s in secrets if s in raw], path
    assert requests == 2
    for path in [data_dir / "metadata.db", data_dir / "fetch_log.jsonl"]:
        text = path.read_bytes().decode("latin-1")
        assert not [s for s in secrets if s in text], path
