"""``scrapy catalog report`` shows names it did not choose (URLs, hosts, settings, item
tables, proxies, error texts) as text: each with ``<b>&"'`` in it appears escaped, and no element of
the page comes from it. A credential in a run's recorded settings is not shown."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from crawler.hub import Hub, ProxyPool
from crawler.storage.actionlog import ActionLog
from crawler.storage.catalog import Catalog
from tests.conftest import ROOT, crawl_env

MARK = "<b>&\"'"
ESCAPED = "&lt;b&gt;&amp;&quot;&#x27;"
# Each place its own mark, to tell which one leaked.
HOST = f"{MARK}host"
TABLE = f"{MARK}table"
SETTING = f"{MARK}setting"
LOG_PROXY = f"http://{MARK}logproxy:3128"
HUB_PROXY = f"http://{MARK}hubproxy:3128"
HUB_FILE = f"{MARK}hub.db"
SECRET = "run-s3cret"
ERROR = f"{MARK}error"  # a failure's kind is the text before its first colon


class Page(HTMLParser):
    """The page as a browser's parser builds it: its elements, and its text and
    attribute values with character references resolved."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        self.text.extend(value or "" for _, value in attrs)

    def handle_startendtag(self, tag, attrs) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data) -> None:
        self.text.append(data)


def write_data_dir(data_dir: Path) -> None:
    data_dir.mkdir()
    with Catalog(data_dir / "metadata.db") as catalog:
        quoted = '"' + TABLE.replace('"', '""') + '"'
        with catalog.transaction():
            # An item table as a crawl makes it: the item columns, then the fields.
            columns = "_key TEXT, _seq INTEGER, _spider TEXT, _parsed_at TEXT, name TEXT"
            catalog.conn.execute(f"CREATE TABLE {quoted} ({columns})")
            catalog.conn.execute(f"INSERT INTO {quoted} VALUES ('k', 0, 's', 't', 'x')")
    log = ActionLog(data_dir / "fetch_log.jsonl")
    url = f"http://{HOST}/{MARK}path?q={MARK}"
    log.write(url, "k1", "error", error=f"{ERROR}: refused", proxy=LOG_PROXY, ts=1_700_000_000)
    log.write(url, "k2", "ok", status=200, bytes=10, proxy=LOG_PROXY, ts=1_700_000_001)
    log.close()
    run = {
        "started": "2026-01-01T00:00:00Z",
        "pid": 1,
        "host": "h",
        "spider": "site",
        # An older or hand-edited run may hold a credential: the page never shows it.
        "settings": {
            "PROXY_NOTE": SETTING,
            "HUB_URL": hub_url(data_dir),
            "FEED_URI": f"http://me:{SECRET}@example.org/feed",
        },
    }
    (data_dir / "runs.jsonl").write_text(json.dumps(run) + "\n")


def hub_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir.parent / HUB_FILE}"


def write_hub(url: str) -> None:
    with Hub.open(url) as hub:
        ProxyPool(hub)  # its tables
        # As an older or hand-edited hub may hold it: `proxies add` would refuse the name.
        with hub.transaction() as tx:
            tx.execute("INSERT INTO hub_proxies (url, added) VALUES (?, NOW())", (HUB_PROXY,))


def test_every_name_the_page_shows_is_escaped_and_makes_no_element(tmp_path):
    data_dir = tmp_path / "data"
    write_data_dir(data_dir)
    write_hub(hub_url(data_dir))
    output = tmp_path / "report.html"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "scrapy",
            "catalog",
            "report",
            "-s",
            f"DATA_DIR={data_dir}",
            "-s",
            f"HUB_URL={hub_url(data_dir)}",
            "-o",
            str(output),
        ],  # fmt: skip
        cwd=ROOT,
        env=crawl_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    html = output.read_text()
    page = Page()
    page.feed(html)
    page.close()
    assert SECRET not in html, "a run's credential is shown"
    assert "http://me:***@example.org/feed" in page.text
    assert "b" not in page.tags, "an element made of a name"
    # Outside the figures, the page's own markup: the mark is never raw in it.
    text_html = html.replace(ESCAPED, "")
    assert MARK[:3] not in text_html and "&\"'" not in text_html, "a mark not escaped"
    shown = "\n".join(page.text)
    for name, place in [
        (HOST, "the host of a URL"),
        (TABLE, "an item table"),
        (SETTING, "a setting's value"),
        (LOG_PROXY, "a proxy of the action log"),
        (HUB_PROXY, "a proxy of the hub"),
        (HUB_FILE, "the hub's URL"),
        (ERROR, "a kind of failure"),
    ]:
        assert name in shown, f"{place} ({name!r}) is not on the page as text"
        assert name.replace(MARK, ESCAPED) in html, f"{place} not escaped"


def test_the_parser_finds_an_element_a_raw_name_makes():
    # The check above sees what it looks for: the same name unescaped is an element.
    page = Page()
    page.feed(f"<td>{HOST}</td>")
    assert "b" in page.tags
