"""Hubs for tests: a SQLite file, or a PostgreSQL schema of the test's own.

Each PostgreSQL hub lives in a fresh schema named after the process and a random tag,
dropped at the end, so that test runs sharing the server never see each other's rows.
Import the fixture into a test module: ``from tests.hubs import hub_url``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crawler.hub import Hub, ProxyPool, redact_url
from tests import launcher
from tests.servers import need

ROOT = Path(__file__).resolve().parent.parent
PG_TEST_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")


def with_search_path(url: str, schema: str) -> str:
    sep = "&" if urlsplit(url).query else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def pg_schema_url(prefix: str = "hubtest") -> tuple[str, Callable[[], None]]:
    """Create a fresh schema; return (url using it, drop function)."""
    try:
        import psycopg
    except ImportError:
        need("psycopg is not installed: pip install 'psycopg[binary]'")
    schema = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_TEST_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        need(f"no PostgreSQL at {redact_url(PG_TEST_URL)} (set PG_TEST_URL): {exc}")
    admin.execute(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()

    return with_search_path(PG_TEST_URL, schema), drop


@pytest.fixture(params=["sqlite", "postgresql"])
def hub_url(request, tmp_path):
    """A hub URL on each backend: a SQLite file, or a schema of its own on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hub.db"
        return
    url, drop = pg_schema_url()
    yield url
    drop()


@contextmanager
def open_proxies(url: str) -> Iterator[ProxyPool]:
    """The proxy pool of the hub at *url*, closed at the end of the block."""
    with Hub.open(url) as hub:
        yield ProxyPool(hub)


def scrapy_with_hub(
    *args: str, hub: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``scrapy ARGS`` from the project root, HUB_URL in its environment set to *hub*
    (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "HUB_URL"}
    env["PYTHONPATH"] = str(ROOT)
    if hub:
        env["HUB_URL"] = hub
    return launcher.run(
        [sys.executable, "-m", "scrapy", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
