"""Work queues split by domain or host: a batch holds one unit's URLs, and a unit's
batches are leased to one holder at a time (or as many as the unit allows), with the
lease and expiry rules of any queue; on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from urllib.parse import urlsplit

import pytest

from crawler.domains import registered_domain
from crawler.hub import Hub
from crawler.hub.workqueue import WorkQueue, WorkQueueError
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture

SITES = ["www.alpha.com", "shop.alpha.com", "beta.co.uk", "gamma.org"]
# Interleaved, as lists are: alpha.com holds half of them over two hosts.
URLS = [f"http://{SITES[n % 4]}/p/{n}" for n in range(24)]


def domain(url: str) -> str:
    return registered_domain(urlsplit(url).hostname)


@pytest.fixture
def hub(hub_url):  # noqa: F811
    with Hub.open(hub_url) as opened:
        yield opened


def loaded(hub, name: str, partition: str = "domain") -> WorkQueue:
    queue = WorkQueue(hub, name)
    queue.load(URLS, partition=partition)
    return queue


def test_a_unit_is_leased_to_one_holder_at_a_time(hub):
    queue = loaded(hub, "q")
    a = queue.lease("a", 4, ttl=60)
    b = queue.lease("b", 4, ttl=60)
    c = queue.lease("c", 4, ttl=60)
    # Three sites, three holders, each batch one site's URLs, the first pending first.
    assert [batch.unit for batch in (a, b, c)] == ["alpha.com", "beta.co.uk", "gamma.org"]
    for batch in (a, b, c):
        assert {domain(url) for url in batch.urls} == {batch.unit}
    assert a.urls == tuple(u for u in URLS if domain(u) == "alpha.com")[:4]
    # Every unit with pending URLs is held: nothing for a fourth holder, though 12 wait.
    assert queue.lease("d", 4, ttl=60) is None
    assert queue.progress().pending == 12
    assert queue.done(a)
    d = queue.lease("d", 4, ttl=60)
    assert d.unit == "alpha.com" and not set(d.urls) & set(a.urls)
    assert queue.release(b)
    assert queue.lease("e", 100, ttl=60).unit == "beta.co.uk"  # given back: free again


def test_lease_many_takes_several_units_in_one_call_each_a_lease_of_its_own(hub):
    queue = loaded(hub, "q")  # alpha.com 12 URLs, beta.co.uk 6, gamma.org 6
    first = queue.lease_many("a", 16, ttl=60)
    # Units in order of their first pending URL, the last one cut at the size asked.
    assert [(batch.unit, len(batch.urls)) for batch in first] == [
        ("alpha.com", 12),
        ("beta.co.uk", 4),
    ]
    assert len({batch.lease_id for batch in first}) == 2
    for batch in first:
        assert {domain(url) for url in batch.urls} == {batch.unit}
    # beta.co.uk's other two wait for its holder: another asker gets gamma.org alone.
    assert [batch.unit for batch in queue.lease_many("b", 16, ttl=60)] == ["gamma.org"]
    assert queue.lease_many("c", 16, ttl=60) == []
    assert queue.done_many(first) == 2
    assert queue.done_many(first) == 0  # ended already
    assert [batch.unit for batch in queue.lease_many("c", 16, ttl=60)] == ["beta.co.uk"]
    assert queue.progress().done == 16
    # A unit that allows two holders is leased twice, by two askers, never a third time.
    shared = loaded(hub, "m")
    shared.set_max_holders("alpha.com", 2)

    def units(asker: str, size: int) -> list[tuple[str, int]]:
        return [(b.unit, len(b.urls)) for b in shared.lease_many(asker, size, ttl=60)]

    assert units("a", 6) == [("alpha.com", 6)]
    assert units("b", 10) == [("beta.co.uk", 6), ("gamma.org", 4)]  # in item order
    assert units("c", 10) == [("alpha.com", 6)]  # its second holder; gamma.org is held
    assert units("d", 10) == []
    url_queue = loaded(hub, "u", partition="url")
    assert [len(batch.urls) for batch in url_queue.lease_many("a", 16, ttl=60)] == [16]


def test_host_units_split_a_site_by_host(hub):
    queue = loaded(hub, "q", partition="host")
    units = [queue.lease(f"h{n}", 100, ttl=60) for n in range(5)]
    assert [b.unit for b in units[:4]] == SITES and units[4] is None
    for batch in units[:4]:
        assert {urlsplit(url).hostname for url in batch.urls} == {batch.unit}
        assert len(batch.urls) == 6


def test_an_expired_lease_is_taken_over_whole_and_its_unit_not_doubled(hub):
    queue = loaded(hub, "q")
    dead = queue.lease("dead", 3, ttl=0.2)
    time.sleep(0.3)  # the hub's clock: NOW() is past the lease's expiry
    heir = queue.lease("heir", 3, ttl=60)
    assert heir.taken_over == dead.lease_id and heir.urls == dead.urls
    assert heir.unit == dead.unit == "alpha.com"
    assert not queue.renew(dead, 60) and not queue.done(dead)
    # The heir holds alpha.com: others get the other sites, then nothing.
    assert {queue.lease(h, 3, ttl=60).unit for h in ("x", "y")} == {"beta.co.uk", "gamma.org"}
    assert queue.lease("z", 3, ttl=60) is None


def test_a_unit_may_allow_more_holders(hub):
    queue = loaded(hub, "q")
    queue.set_max_holders("alpha.com", 2)
    batches = [queue.lease(h, 2, ttl=60) for h in ("a", "b", "c", "d", "e")]
    # By the order of the first pending URL: alpha.com a second time only after the others.
    assert [b.unit if b else None for b in batches] == [
        "alpha.com", "beta.co.uk", "gamma.org", "alpha.com", None,
    ]  # fmt: skip
    assert not set(batches[0].urls) & set(batches[3].urls)
    with pytest.raises(ValueError):
        queue.set_max_holders("alpha.com", 0)


def test_a_queue_keeps_the_mode_it_was_loaded_with(hub):
    queue = loaded(hub, "q")
    queue.load(URLS[:3], partition="domain")  # again: nothing added, nothing refused
    with pytest.raises(WorkQueueError, match=r"queue 'q' .* is split by domain, not url: "
                       r"load it with --partition domain, or under a new name"):  # fmt: skip
        queue.load(URLS, partition="url")
    with pytest.raises(WorkQueueError, match="'site' is not a partition mode"):
        WorkQueue(hub, "other").load(URLS, partition="site")
    # A url queue leases any URLs, as before: one batch may hold every site.
    plain = loaded(hub, "plain", partition="url")
    batch = plain.lease("a", 8, ttl=60)
    assert batch.unit is None and len({domain(u) for u in batch.urls}) == 3
    assert plain.lease("b", 8, ttl=60) is not None


def test_no_unit_has_two_holders_under_contention(hub_url):  # noqa: F811
    urls = [f"http://site{n % 5}.example.com/p/{n}" for n in range(150)]
    with Hub.open(hub_url) as hub:
        WorkQueue(hub, "busy").load(urls, partition="domain")
    held: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    got: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with Hub.open(hub_url) as hub:
                queue = WorkQueue(hub, "busy", create=False)
                while not queue.progress().finished:
                    batch = queue.lease(name, 4, ttl=60)
                    if batch is None:
                        continue
                    # Between the lease's return and the call that ends it, this thread
                    # holds the unit: no other may hold it in that span.
                    start = time.monotonic()
                    time.sleep(0.002)
                    end = time.monotonic()
                    with lock:
                        held[batch.unit].append((start, end, name))
                        got.update(batch.urls)
                    assert queue.done(batch)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert sorted(got) == sorted(urls) and set(got.values()) == {1}
    for unit, spans in held.items():
        spans.sort()
        for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"{unit} held by {first} and {second} at once"


def test_queue_load_takes_the_partition_from_the_option_or_the_setting(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{url}\n" for url in URLS))
    done = scrapy_with_hub("queue", "load", "d", str(urls), hub=hub)
    assert done.returncode == 0, done.stderr
    # Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN (8), which host budgets hold cluster-wide.
    assert "queue 'd': a batch per domain, leased to up to 8 holders at a time" in done.stdout
    done = scrapy_with_hub("queue", "load", "h", str(urls), "--partition", "host", hub=hub)
    assert "a batch per host" in done.stdout, done.stderr
    done = scrapy_with_hub("queue", "-s", "CRAWL_PARTITION=url", "load", "u", str(urls), hub=hub)
    assert "queue 'u': batches of any URLs" in done.stdout, done.stderr
    again = scrapy_with_hub("queue", "load", "u", str(urls), hub=hub)
    assert again.returncode == 1
    assert "is split by url, not domain: load it with --partition url" in again.stderr
    bad = scrapy_with_hub("queue", "-s", "CRAWL_PARTITION=sites", "load", "x", str(urls), hub=hub)
    assert bad.returncode == 2 and "CRAWL_PARTITION='sites'" in bad.stderr
    assert "give one of domain, host, url" in bad.stderr


def lease_at_once(url: str, name: str, holders: list[str]) -> dict[str, str | None]:
    """Each holder leases a batch of queue *name* at the same moment, over a connection
    of its own, and keeps it: the unit each one got (None: nothing)."""
    got: dict[str, str | None] = {}
    start = threading.Barrier(len(holders))

    def holder(who: str) -> None:
        with Hub.open(url) as hub:
            queue = WorkQueue(hub, name, create=False)
            start.wait(timeout=30)
            batch = queue.lease(who, 2, ttl=60)
            got[who] = batch.unit if batch else None

    threads = [threading.Thread(target=holder, args=(who,)) for who in holders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return got


def test_queue_load_lets_a_unit_have_as_many_holders_as_its_host_budget(tmp_path, hub_url):  # noqa: F811
    # One large site and a small one, the list sorted by site.
    urls = tmp_path / "urls.txt"
    big = [f"http://www.alpha.com/p/{n}" for n in range(8)]
    urls.write_text(
        "".join(f"{url}\n" for url in [*big, "http://beta.co.uk/", "http://beta.co.uk/x"])
    )
    two = scrapy_with_hub("queue", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=2", "load", "two",
                          str(urls), hub=hub_url)  # fmt: skip
    assert two.returncode == 0, two.stderr
    assert "a batch per domain, leased to up to 2 holders at a time" in two.stdout
    # The hub keeps a host to 2 requests at once whoever asks: two holders fetch alpha.com.
    got = lease_at_once(hub_url, "two", ["a", "b", "c"])
    assert sorted(got.values()) == ["alpha.com", "alpha.com", "beta.co.uk"], got
    # A budget of 1, or none shared (each process keeps its own limits): one holder.
    for name, setting in (("one", "CONCURRENT_REQUESTS_PER_DOMAIN=1"),
                          ("own", "HOST_BUDGET_ENABLED=0")):  # fmt: skip
        done = scrapy_with_hub("queue", "-s", setting, "load", name, str(urls), hub=hub_url)
        assert "leased to one holder at a time" in done.stdout, done.stderr
        got = lease_at_once(hub_url, name, ["a", "b", "c"])
        assert sorted(map(str, got.values())) == ["None", "alpha.com", "beta.co.uk"], got
    with Hub.open(hub_url) as hub:
        two = WorkQueue(hub, "two", create=False)
        held = [lease for lease in two.leases() if lease["ended"] is None]
        assert len(held) == 3
        # An asker whose own settings allow one holder (host budgets off) shares no
        # unit, whatever the queue was loaded with.
        WorkQueue(hub, "again").load(big, partition="domain", holders=2)
        again = WorkQueue(hub, "again", create=False)
        assert again.lease("a", 2, ttl=60, holders=1).unit == "alpha.com"
        assert again.lease("b", 2, ttl=60, holders=1) is None
        assert again.lease("b", 2, ttl=60, holders=2).unit == "alpha.com"
        assert again.lease("c", 2, ttl=60, holders=3) is None  # the unit's own 2
