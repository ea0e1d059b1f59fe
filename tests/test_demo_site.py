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
