"""``scrapy catalog report``: a real crawl with errors, retries and a proxy hub, the page
opened in Chromium; empty and missing directories; a Slurm-style DATA/; --watch."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.hub import Hub, ProxyPool, WorkQueue, redact_url
from spiders.products import ProductsSpider
from tests import launcher
from tests.browser import Chromium
from tests.conftest import ROOT, crawl_env, write_urls
from tests.crawls import crawl, crawl_site, crawled
from tests.polling import wait_until
from tests.proxy_servers import proxy_pool  # noqa: F401

# Each run's rates, then the whole data directory's.
FIGURES = ("status", "types", "hosts", "host-rates", "proxies", "leases", "items")
RUN_FIGURES = ("rate", "outcomes")


def report_command(data_dir: Path, output: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "scrapy",
        "catalog",
        "report",
        "-s",
        f"DATA_DIR={data_dir}",
        "-o",
        str(output),
        *args,
    ]


def run_report(data_dir: Path, output: Path, env: dict | None = None):
    return subprocess.run(
        report_command(data_dir, output),
        cwd=ROOT,
        env=env or crawl_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def demo_urls(base: str) -> list[str]:
    """Pages, a 500 (retried, then an error), 503s once (a retry, then a page), a 404,
    a 410, a slow page and a binary body."""
    urls = [f"{base}/page/{n}.html" for n in range(12)]
    urls += [f"{base}/error/{n}" for n in range(2)]
    urls += [f"{base}/flaky/{n}" for n in range(900, 903)]
    urls += [f"{base}/missing/1", f"{base}/gone/2", f"{base}/slow/3?ms=300", f"{base}/binary/4"]
    return urls


# --- reading the page in Chromium ------------------------------------------------------------
MARKS_JS = """name => Array.from(
    document.querySelectorAll(`#plot-${name} svg [id^="${name}-mark-"]`)
).filter(e => { const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length"""

STATS_JS = """() => Object.fromEntries(Array.from(document.querySelectorAll('[data-stat]'))
    .map(e => [e.dataset.stat, Number(e.dataset.value)]))"""


# Per figure: whether its title (figcaption) is above its drawing, and the title.
TITLES_JS = """() => Array.from(document.querySelectorAll('figure.plot')).map(f => {
    const caption = f.querySelector('figcaption'), svg = f.querySelector('svg');
    if (!caption || !svg) return [f.id, false, ''];
    return [f.id, caption.getBoundingClientRect().bottom <= svg.getBoundingClientRect().top + 1,
            caption.textContent.trim()];
})"""
# How far the page reaches past the window's right edge (a sideways scroll).
OVERFLOW_JS = "() => document.documentElement.scrollWidth - window.innerWidth"
# Tables whose box scrolls sideways (cut at the right until scrolled), by their first
# header.
CUT_TABLES_JS = """() => Array.from(document.querySelectorAll('.wide'))
    .filter(box => box.scrollWidth > box.clientWidth + 1)
    .map(box => (box.querySelector('th') || box).textContent.trim())"""
# The smallest drawn height of a tick label or axis text of any figure, in CSS pixels.
SMALLEST_TEXT_JS = """() => Math.min(...Array.from(document.querySelectorAll('figure.plot svg text'))
    .map(t => t.getBoundingClientRect().height).filter(h => h > 0))"""


_CHROMIUM: list[Chromium] = []


@pytest.fixture(scope="module", autouse=True)
def _one_browser():
    yield
    while _CHROMIUM:
        _CHROMIUM.pop().close()


def open_in_chromium(path: Path, width: int = 1280, screenshot: Path | None = None) -> dict:
    """Load the page in a window *width* px wide (a full-page screenshot to
    *screenshot*); returns console messages, page errors, marks per figure and stats."""
    if not _CHROMIUM:
        _CHROMIUM.append(Chromium())
    return _CHROMIUM[0].run(read_page, path, screenshot, width=width)


def read_page(context, path: Path, screenshot: Path | None = None) -> dict:
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: console.append(f"requestfailed: {r.url}"))
    page.goto(path.resolve().as_uri(), wait_until="load")
    figures = page.eval_on_selector_all("figure.plot", "fs => fs.map(f => f.id)")
    names = [f.removeprefix("plot-") for f in figures]
    marks = {name: page.evaluate(MARKS_JS, name) for name in names}
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    return {
        "overflow": page.evaluate(OVERFLOW_JS),
        "cut": page.evaluate(CUT_TABLES_JS),
        "smallest_text": page.evaluate(SMALLEST_TEXT_JS) if figures else None,
        "titles": page.evaluate(TITLES_JS),
        "console": console,
        "figures": figures,
        "marks": marks,
        "stats": page.evaluate(STATS_JS),
        "empty": page.locator("#empty").count(),
        "settings": page.eval_on_selector_all(
            "[data-setting]",
            "es => Object.fromEntries(es.map(e => [e.dataset.setting, e.textContent]))",
        ),
    }


# --- what the test counts itself -------------------------------------------------------------
def log_counts(path: Path) -> dict[str, float]:
    expected: dict[str, float] = {}
    outcomes: Counter[str] = Counter()
    hosts: defaultdict[str, Counter[str]] = defaultdict(Counter)
    proxies: defaultdict[str, Counter[str]] = defaultdict(Counter)
    lines = 0
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        lines += 1
        outcomes[entry["outcome"]] += 1
        if entry["outcome"] in ("retry", "error"):
            host = urlsplit(entry["url"]).hostname
            # One name per cause: a retry's "500 Internal Server Error" is the final
            # error's "HTTP 500".
            error = entry["error"] or ""
            status = re.match(r"(?:HTTP )?(\d{3})\b", error)
            kind = f"HTTP {status.group(1)}" if status else error.split(":")[0].strip()
            hosts[host][kind] += 1
        if entry.get("proxy"):
            proxies[entry["proxy"]][entry["outcome"]] += 1
    expected["log:lines"] = lines
    for outcome in ("ok", "cache_hit", "not_modified", "retry", "error"):
        expected[f"outcome:{outcome}"] = outcomes[outcome]
    for host, kinds in hosts.items():
        expected[f"host:{host}"] = sum(kinds.values())
        for kind, n in kinds.items():
            expected[f"hostkind:{host}:{kind}"] = n
    for proxy, counts in proxies.items():
        for outcome, n in counts.items():
            expected[f"proxylog:{proxy}:{outcome}"] = n
    return expected


def catalog_counts(db: Path) -> dict[str, float]:
    conn = sqlite3.connect(db)
    try:
        expected: dict[str, float] = {}
        rows, size = conn.execute("SELECT count(*), sum(bytes) FROM artifacts").fetchone()
        expected["catalog:rows"], expected["catalog:bytes"] = rows, size
        for status, n in conn.execute("SELECT status, count(*) FROM artifacts GROUP BY status"):
            expected[f"status:{status}"] = n
        types: Counter[str] = Counter()
        for ctype, n in conn.execute("SELECT content_type, count(*) FROM artifacts GROUP BY 1"):
            types[(ctype or "(none)").split(";")[0].strip().lower()] += n
        for ctype, n in types.items():
            expected[f"type:{ctype}"] = n
        return expected
    finally:
        conn.close()


def item_counts(db: Path) -> dict[str, float]:
    """Rows, pages covered and share of stored pages of each item table the crawl wrote,
    counted with plain SQL (bookkeeping tables, named ``_...``, are not item tables)."""
    conn = sqlite3.connect(db)
    try:
        (rows,) = conn.execute("SELECT count(*) FROM artifacts").fetchone()
        expected: dict[str, float] = {}
        # page_summary from the site spider's pages, product from the products spider's.
        for table in ("page_summary", "product"):
            n, pages = conn.execute(
                f"SELECT count(*), count(DISTINCT _key) FROM {table}"
            ).fetchone()
            expected |= {
                f"items:{table}:rows": n,
                f"items:{table}:pages": pages,
                f"items:{table}:share": pages / rows,
            }
        return expected
    finally:
        conn.close()


def bookkeeping_tables(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '\\_%' "
                "ESCAPE '\\'"
            )
        ]
    finally:
        conn.close()


def hub_counts(hub_url: str) -> dict[str, float]:
    with Hub.open(hub_url) as hub:
        pool = ProxyPool(hub)
        leases = Counter(u.proxy_id for u in pool.usage())
        expected = {}
        for p in pool.proxies():
            url = redact_url(p.url)
            expected[f"proxy:{url}:requests"] = p.total_uses
            expected[f"proxy:{url}:bans"] = p.bans
            expected[f"proxy:{url}:leases"] = leases[p.id]
        return expected


def assert_stats(shown: dict[str, float], expected: dict[str, float]) -> None:
    missing = sorted(set(expected) - set(shown))
    assert not missing, f"not in the page: {missing}"
    wrong = {k: (shown[k], v) for k, v in expected.items() if shown[k] != pytest.approx(v)}
    assert not wrong, f"page vs counted: {wrong}"


# --- tests -----------------------------------------------------------------------------------
# The crawls run in process (tests/crawls.py); the report is made by the command.
@pytest.fixture(scope="module")
def one_page(site, tmp_path_factory):
    """A data directory of a crawl of one page (tests copy it before they change it)."""
    data_dir = tmp_path_factory.mktemp("one_page") / "data"
    crawled(crawl_site([f"{site.base_url}/page/1.html"], data_dir))
    return data_dir


@deferred_f_from_coro_f
async def test_report_of_a_crawl_with_errors_and_a_proxy_hub(tmp_path, site, proxy_pool):  # noqa: F811
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub_url) as hub:
        # The 403 proxy first: the crawl's first lease is banned and rests.
        pool = ProxyPool(hub)
        pool.add([proxy_pool["proxy-deny"].url])
        pool.add([proxy_pool["proxy-open"].url, proxy_pool["proxy-auth"].url])
    data_dir = tmp_path / "data"
    settings = {
        "HUB_URL": hub_url,
        "PROXY_ROTATE_EVERY": "3",
        "PROXY_REST_SECONDS": "0",
        "PROXY_BAN_REST_SECONDS": "3600",
        "PROXY_LEASES_PER_PROCESS": "1",
        "CONCURRENT_REQUESTS": "2",
    }
    await crawl_site(demo_urls(site.base_url), data_dir, settings, summaries="1")
    # Items: the products spider parses product pages into the same data directory.
    products = [f"{site.base_url}/product/{n}.html" for n in range(5)]
    # The latest run's settings are the page's, not the report command's.
    settings = {"CONCURRENT_REQUESTS": "7", "PROXY_NOTE": "http://me:run-s3cret@127.0.0.1:3128"}
    p_urls = write_urls(tmp_path / "p.txt", products)
    await crawl(ProductsSpider, data_dir, settings, urls=str(p_urls))
    expected = log_counts(data_dir / "fetch_log.jsonl")
    assert expected["outcome:retry"] > 0 and expected["outcome:error"] > 0
    assert any(k.startswith("proxylog:") for k in expected), "the crawl went through proxies"
    expected |= item_counts(data_dir / "metadata.db")
    assert expected["items:product:pages"] == len(products), expected
    bookkeeping = bookkeeping_tables(data_dir / "metadata.db")
    assert "_item_pages" in bookkeeping, bookkeeping
    expected |= catalog_counts(data_dir / "metadata.db")
    expected |= hub_counts(hub_url)
    assert any(k.endswith(":bans") and v for k, v in expected.items()), "a proxy was banned"

    output = tmp_path / "out" / "report.html"
    env = crawl_env() | {"HUB_URL": hub_url}  # the hub from the environment, as a crawl's
    made = run_report(data_dir, output, env)
    assert made.returncode == 0, made.stderr[-3000:]
    text = output.read_text()
    assert "<script" not in text and "http://" not in text.split("<body")[0]
    assert "pr0xy-s3cret" not in text, "proxy credentials are redacted"
    assert "run-s3cret" not in text, "the run's settings are redacted"
    assert 'data-run-spider="products"' in text

    page = open_in_chromium(output, screenshot=tmp_path / "report-1280.png")
    assert page["console"] == []
    # Every table fits the window, the proxies' attempts by outcome included.
    assert page["cut"] == [], f"tables cut at 1280 px: {page['cut']}"
    assert page["overflow"] <= 0
    # Two runs (runs.jsonl): the site spider's, then the products spider's.
    figures = [*FIGURES, *(f"{f}-r{run}" for f in RUN_FIGURES for run in (1, 2))]
    assert sorted(page["figures"]) == sorted(f"plot-{name}" for name in figures)
    assert all(page["marks"][name] > 0 for name in figures), page["marks"]
    assert_stats(page["stats"], expected)
    reported = {k.split(":")[1] for k in page["stats"] if k.startswith("items:")}
    assert reported == {"page_summary", "product"}, (
        "bookkeeping tables (_item_pages, ...) are not item tables"
    )
    assert page["settings"]["DATA_DIR"] == str(data_dir)
    assert page["settings"]["HUB_URL"] == hub_url
    assert page["settings"]["CONCURRENT_REQUESTS"] == "7"
    assert page["settings"]["PROXY_NOTE"] == "http://me:***@127.0.0.1:3128"


def test_empty_data_dir_says_so(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    output = tmp_path / "report.html"
    made = run_report(empty, output)
    assert made.returncode == 0, made.stderr[-3000:]
    page = open_in_chromium(output)
    assert page["console"] == [] and page["empty"] == 1 and page["figures"] == []


def test_missing_data_dir_is_an_error(tmp_path):
    missing = tmp_path / "nowhere"
    made = run_report(missing, tmp_path / "report.html")
    assert made.returncode == 2
    assert f"{missing}: no such data directory" in made.stderr
    assert not (tmp_path / "report.html").exists()


def test_work_queues_show_how_much_is_left(tmp_path, site, one_page):
    data_dir = tmp_path / "data"
    shutil.copytree(one_page, data_dir)
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    env = crawl_env() | {"HUB_URL": hub_url}
    lists = {"front": 20, "back": 7}
    for name, n in lists.items():
        urls = write_urls(
            tmp_path / f"{name}.txt", [f"{site.base_url}/page/{i}.html" for i in range(n)]
        )
        loaded = launcher.run([sys.executable, "-m", "scrapy", "queue", "load", name, str(urls)],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert loaded.returncode == 0, loaded.stderr[-3000:]
    with Hub.open(hub_url) as hub:
        front = WorkQueue(hub, "front", create=False)
        for failed in (0, 2):
            batch = front.lease("node1/1", 5, ttl=3600)
            assert front.done(batch, failed=batch.urls[:failed])
        assert front.lease("node2/7", 4, ttl=3600) is not None  # held, not done
        back = WorkQueue(hub, "back", create=False)
        assert back.done(back.lease("node1/1", 7, ttl=3600))
        expected: dict[str, float] = {}
        for queue in (front, back):
            stats = queue.stats()
            p = stats.progress
            expected |= {
                f"queue:{queue.name}:total": p.total,
                f"queue:{queue.name}:done": p.done,
                f"queue:{queue.name}:pending": p.pending,
                f"queue:{queue.name}:leased": p.leased,
                f"queue:{queue.name}:failed": stats.failed,
            }
    # The 2 URLs that failed went back to the queue (pending again), counted.
    assert expected["queue:front:done"] == 8 and expected["queue:front:pending"] == 8
    assert expected["queue:front:leased"] == 4 and expected["queue:front:failed"] == 2
    assert expected["queue:back:done"] == 7 and expected["queue:back:pending"] == 0

    output = tmp_path / "report.html"
    made = run_report(data_dir, output, env)
    assert made.returncode == 0, made.stderr[-3000:]
    page = open_in_chromium(output)
    assert page["console"] == []
    assert_stats(page["stats"], expected)
    # Done lately: an ETA in seconds for what is left; a queue all done shows 0.
    assert page["stats"]["queue:front:eta"] > 0
    assert page["stats"]["queue:back:eta"] == 0


def ship(data_dir: Path, catalogs: Path, name: str) -> None:
    """Lay a crawl's catalog and log out as a Slurm task's, as the shipper does."""
    src = sqlite3.connect(data_dir / "metadata.db")
    dst = sqlite3.connect(catalogs / f"{name}.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    shutil.copyfile(data_dir / "fetch_log.jsonl", catalogs / f"{name}.fetch_log.jsonl")


@deferred_f_from_coro_f
async def test_the_report_reads_at_1280_and_800_px_and_on_a_phone(tmp_path, site):
    data_dir = tmp_path / "data"
    urls = [*demo_urls(site.base_url), f"{site.base_url}/private/5"]  # robots.txt forbids
    await crawl_site(urls, data_dir)
    await crawl_site(urls, data_dir)  # a second run: resumed, the 500s tried again
    output = tmp_path / "report.html"
    made = run_report(data_dir, output)
    assert made.returncode == 0, made.stderr[-3000:]
    for width in (1280, 800, 390):
        shot = tmp_path / f"report-{width}.png"
        page = open_in_chromium(output, width, screenshot=shot)
        assert shot.stat().st_size > 10_000, shot
        assert page["console"] == [], width
        assert page["overflow"] <= 0, f"{page['overflow']} px sideways at {width} px"
        if width >= 800:
            assert page["cut"] == [], f"tables cut at {width} px: {page['cut']}"
        # Ticks and labels at 9 pt or more, as drawn: a figure too wide for a phone
        # scrolls inside its box rather than shrink.
        assert page["smallest_text"] >= 11.5, (width, page["smallest_text"])
        assert len(page["titles"]) >= 6  # two per run, status, types, hosts
        untitled = [(fig, title) for fig, above, title in page["titles"] if not above or not title]
        assert not untitled, f"figures without a title above them at {width} px: {untitled}"
    text = output.read_text()
    # Each run its own section, its own rate over its active time.
    assert 'id="run-1"' in text and 'id="run-2"' in text
    assert page["stats"]["run:1:pages"] == len(urls) - 3  # not the 500s, nor robots
    assert page["stats"]["run:2:pages"] == 0  # all stored already
    assert page["stats"]["run:1:pages_per_s"] > 0
    # One name per cause, each with what to do about it.
    causes = [k.split(":", 3)[3] for k in page["stats"] if k.startswith("run:1:cause:")]
    # (A 503 too when no other test asked the shared site for the flaky pages first.)
    assert (
        {"HTTP 500", "forbidden by robots.txt"}
        <= set(causes)
        <= {
            "HTTP 500",
            "HTTP 503",
            "forbidden by robots.txt",
        }
    ), causes
    assert "500 Internal Server Error" not in text
    # The 500s: given up, no row, in both runs; the 503s (flaky) retried and stored.
    assert text.count("2 URLs given up with it, and none of them has a stored row") == 2
    assert "Not stored" not in text


@deferred_f_from_coro_f
async def test_slurm_data_shows_each_task(tmp_path, site):
    catalogs = tmp_path / "DATA" / "catalogs"
    catalogs.mkdir(parents=True)
    names = ["7_0_r0_p0", "7_1_r0_p0"]
    expected: dict[str, float] = {"catalog:rows": 0}
    for i, name in enumerate(names):
        urls = [f"{site.base_url}/page/{n}.html" for n in range(100 + 10 * i, 108 + 10 * i)]
        urls += [f"{site.base_url}/error/{50 + i}"]
        data_dir = tmp_path / f"task{i}"
        await crawl_site(urls, data_dir)
        ship(data_dir, catalogs, name)
        counts = log_counts(catalogs / f"{name}.fetch_log.jsonl")
        expected[f"task:{name}:lines"] = counts["log:lines"]
        expected[f"task:{name}:pages"] = counts["outcome:ok"]
        expected["catalog:rows"] += catalog_counts(catalogs / f"{name}.db")["catalog:rows"]
    output = tmp_path / "report.html"
    made = run_report(tmp_path / "DATA", output)
    assert made.returncode == 0, made.stderr[-3000:]
    page = open_in_chromium(output)
    assert page["console"] == []
    assert_stats(page["stats"], expected)
    assert all(page["stats"][f"task:{name}:pages_per_s"] > 0 for name in names)
    # Two lines (pages/s and bytes/s) per task; no runs.jsonl in DATA/: one section.
    assert page["marks"]["rate-r0"] == 2 * len(names)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_watch_rewrites_until_interrupted(tmp_path, site, signum, one_page):
    data_dir = tmp_path / "data"
    shutil.copytree(one_page, data_dir)
    output = tmp_path / "live" / "report.html"
    watcher = subprocess.Popen(
        report_command(data_dir, output, "--watch", "0.2"),
        cwd=ROOT,
        env=crawl_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = wait_until(
            lambda: output.exists() and output.stat().st_mtime_ns, "a report", proc=watcher
        )
        wait_until(lambda: output.stat().st_mtime_ns != first, "a rewrite", proc=watcher)
        # What the log gains while it is watched shows in a later rewrite.
        log = data_dir / "fetch_log.jsonl"
        lines = log.read_text().splitlines()
        with log.open("a") as out:
            out.write("\n".join(lines) + "\n")
        shown = f'data-stat="log:lines" data-value="{2 * len(lines)}"'
        wait_until(lambda: shown in output.read_text(), "the longer log shown", proc=watcher)
        watcher.send_signal(signum)
        _, stderr = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, stderr[-3000:]
    assert "</html>" in output.read_text()
    assert [p.name for p in output.parent.iterdir()] == ["report.html"], "no temporary left"
