"""The demo site as the benchmarks use it: crawls open many connections at once."""

from __future__ import annotations

import shutil
import subprocess
from urllib.parse import urlsplit

import pytest

from demo.site import DemoSite


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_the_site_queues_the_connections_of_several_crawls_at_once():
    """Eight crawls of CONCURRENT_REQUESTS=16 connect 128 times at once: the listening
    socket queues them all (a SYN beyond the queue is sent again a second or more later,
    and a few pages then take tens of seconds)."""
    site = DemoSite(pages=10)
    port = urlsplit(site.start()).port
    try:
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
        ).stdout
    finally:
        site.stop()
    # A listening socket's Send-Q is its backlog.
    (line,) = out.splitlines()
    assert int(line.split()[2]) >= 128, line


def test_the_product_pages_images_are_served(site):
    """Every image a product page shows answers with a picture (the media how-to uses
    the demo site as its server), the same bytes every time."""
    from io import BytesIO
    from urllib.request import urlopen

    from parsel import Selector
    from PIL import Image

    with urlopen(f"{site.base_url}/product/7.html", timeout=30) as page:
        sources = Selector(text=page.read().decode()).css("ul.gallery img::attr(src)").getall()
    assert len(sources) == 3
    for src in sources:
        with urlopen(site.base_url + src, timeout=30) as answer:
            assert answer.status == 200 and answer.headers["Content-Type"] == "image/jpeg"
            body = answer.read()
        assert Image.open(BytesIO(body)).format == "JPEG"
        with urlopen(site.base_url + src, timeout=30) as again:
            assert again.read() == body
