"""The archive replays in pywb, the web archivists' replay tool.

pywb runs from a virtualenv of its own (``tests.toolvenv``): its pins would break the
project's.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from crawler.storage.datadir import DataDir
from tests.conftest import run_crawl, write_urls
from tests.servers import free_port
from tests.toolvenv import tool_bin

COLLECTION = "coll"
# How long a fresh pywb may take to import and index before the test gives up on it
# (a failure bound, never a pass condition).
STARTUP_LIMIT = 120.0


@pytest.fixture(scope="session")
def pywb_bin() -> Path:
    """The bin directory of a virtualenv holding pywb (``wayback``, ``wb-manager``)."""
    return tool_bin("pywb", "pywb", "wayback")


def fetch(url: str) -> tuple[str, bytes]:
    """GET ``url`` following redirects; the final URL and body."""
    with urllib.request.urlopen(url, timeout=60) as answer:
        return answer.geturl(), answer.read()


@pytest.fixture
def wayback(pywb_bin, tmp_path) -> Iterator[tuple[Path, str]]:
    """A pywb server over an empty collection: (its directory, its base URL)."""
    root = tmp_path / "pywb"
    root.mkdir()
    subprocess.run(
        [str(pywb_bin / "wb-manager"), "init", COLLECTION],
        cwd=root,
        check=True,
        capture_output=True,
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "wayback.log", "wb")
    server = subprocess.Popen(
        [str(pywb_bin / "wayback"), "-b", "127.0.0.1", "-p", str(port)],
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + STARTUP_LIMIT
        while True:
            if server.poll() is not None:
                pytest.fail(f"wayback exited: {(tmp_path / 'wayback.log').read_text()[-2000:]}")
            try:
                fetch(f"{base}/")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    pytest.fail(f"wayback did not answer on {base}")
                time.sleep(0.2)
        yield root, base
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_pywb_replays_a_followed_redirect_and_its_page(site, tmp_path, data_dir, wayback, pywb_bin):
    root, base = wayback
    listed = f"{site.base_url}/redirect/7"
    page = f"{site.base_url}/page/7.html"
    crawl = run_crawl(write_urls(tmp_path / "u.txt", [listed]), data_dir)
    assert crawl.returncode == 0, crawl.stderr[-3000:]
    archives = [str(p) for p in DataDir(data_dir).archives()]
    assert archives
    # pywb indexes a collection's files as they are added; the running server reads
    # the new index on the next request.
    subprocess.run(
        [str(pywb_bin / "wb-manager"), "add", COLLECTION, *archives],
        cwd=root,
        check=True,
        capture_output=True,
    )
    expected = site.payload("/page/7.html")
    # In mp_ (page) mode pywb rewrites the stored 301's Location into the replay, so
    # following it lands on the stored page; id_ (identity) mode serves the stored
    # payload untouched, but leaves Location as stored, so its bytes are read there.
    final, _ = fetch(f"{base}/{COLLECTION}/mp_/{listed}")
    assert final == f"{base}/{COLLECTION}/mp_/{page}"
    _, body = fetch(final.replace("/mp_/", "/id_/", 1))
    assert body == expected
    final, body = fetch(f"{base}/{COLLECTION}/id_/{page}")
    assert final == f"{base}/{COLLECTION}/id_/{page}"
    assert body == expected
