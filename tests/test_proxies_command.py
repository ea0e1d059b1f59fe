"""``scrapy proxies``: the ProxyAdmin logic in process, the command in a subprocess."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from crawler.admin import ProxyAdmin, ProxyFileError, read_proxy_file
from crawler.hub import Holder, Hub, HubError, ProxyPool, RestPolicy, UsageCounts
from crawler.hub import db as hub_db
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture

HOLDER = Holder("node9", 9)


def scrapy(*args: str, hub: str | None = None):
    return scrapy_with_hub("proxies", *args, hub=hub)


def test_admin_add_list_disable_stats(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        pool = ProxyPool(hub)
        admin = ProxyAdmin(pool)
        assert "added 2 proxies, 0 already" in admin.add(
            ["http://bob:hunter2@127.0.0.1:3128", "http://127.0.0.1:3129"]
        )
        lease = pool.acquire(Holder("node7", 42, "99_3"), 60)
        table = admin.list()
        assert "hunter2" not in table and "http://bob:***@127.0.0.1:3128" in table
        header, rule, *rows = table.splitlines()
        assert header.split()[:4] == ["id", "proxy", "state", "holder"]
        assert "leased" in rows[0] and "node7/42/99_3" in rows[0]
        assert "free" in rows[1]
        pool.release(lease, "banned", None, None)
        assert "banned" in admin.list().splitlines()[2]
        assert "disabled" in admin.set_enabled("http://bob:***@127.0.0.1:3128", False)
        assert "disabled" in admin.list().splitlines()[2]
        assert "enabled" in admin.set_enabled("1", True)
        stats = admin.stats()
        assert "ban rate" in stats and "hunter2" not in stats
        with pytest.raises(HubError, match="no proxy in the hub match"):
            admin.set_enabled("http://127.0.0.1:1", False)


def test_proxy_file_reports_the_bad_line(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("# pool\nhttp://a:pw@127.0.0.1:1\n\nhttp://127.0.0.1:2\n")
    assert read_proxy_file(good) == ["http://a:pw@127.0.0.1:1", "http://127.0.0.1:2"]
    bad = tmp_path / "bad.txt"
    bad.write_text("http://127.0.0.1:1\nftp://u:hunter2@127.0.0.1:2\n")
    with pytest.raises(ProxyFileError, match=r"bad.txt, line 2: .*use http:// or https://") as info:
        read_proxy_file(bad)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ProxyFileError, match="cannot read the proxy list"):
        read_proxy_file(tmp_path / "missing.txt")


def test_hub_url_from_setting_then_environment():
    env = {"HUB_URL": "sqlite:///b.db"}
    assert hub_db.hub_url({"HUB_URL": "sqlite:///a.db"}, env) == "sqlite:///a.db"
    assert hub_db.hub_url(Settings({"HUB_URL": None}), env) == "sqlite:///b.db"
    assert hub_db.hub_url({}, {}) is None
    with pytest.raises(HubError, match="set HUB_URL"):
        hub_db.hub_url({}, {}, required=True)


def test_command_end_to_end(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    done = scrapy("add", "http://bob:hunter2@127.0.0.1:3128", "http://127.0.0.1:3129", hub=hub)
    assert done.returncode == 0 and "added 2 proxies" in done.stdout, done.stderr
    listing = tmp_path / "more.txt"
    listing.write_text("http://127.0.0.1:3130\n# comment\nhttp://127.0.0.1:3129\n")
    assert "added 1 proxies, 1 already" in scrapy("import", str(listing), hub=hub).stdout
    assert "disabled" in scrapy("disable", "http://127.0.0.1:3129", hub=hub).stdout
    table = scrapy("list", hub=hub).stdout
    assert "http://bob:***@127.0.0.1:3128" in table and "disabled" in table
    assert "ban rate" in scrapy("stats", hub=hub).stdout
    # -s HUB_URL works as well as the environment variable.
    assert "enabled" in scrapy("-s", f"HUB_URL={hub}", "enable", "2").stdout
    everything = "".join(
        scrapy(*args, hub=hub).stdout + scrapy(*args, hub=hub).stderr
        for args in [("list",), ("stats",)]
    )
    assert "hunter2" not in everything


def test_command_errors_are_clear(tmp_path):
    bad = scrapy("add", "ftp://u:hunter2@127.0.0.1:1", hub=f"sqlite:///{tmp_path}/hub.db")
    assert bad.returncode == 2 and "use http:// or https://" in bad.stderr
    assert "hunter2" not in bad.stdout + bad.stderr
    nohub = scrapy("list")
    assert nohub.returncode == 2 and "set HUB_URL" in nohub.stderr
    down = scrapy("list", hub="postgresql://u:hunter2@127.0.0.1:1/x")
    assert down.returncode == 1 and "cannot reach the hub" in down.stderr
    assert "hunter2" not in down.stdout + down.stderr
    usage = scrapy("frobnicate", hub=f"sqlite:///{tmp_path}/hub.db")
    assert usage.returncode == 2 and "give one of" in usage.stderr


def test_command_has_help():
    done = scrapy("--help")
    assert done.returncode == 0 and "import FILE" in done.stdout and "HUB_URL" in done.stdout


def test_stats_show_leases_per_host_and_the_wait_for_a_proxy(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        pool = ProxyPool(hub)
        admin = ProxyAdmin(pool)
        pool.add([f"http://127.0.0.1:{port}" for port in (3128, 3129, 3130)])
        pool.acquire(Holder("node1", 1), 60, waited=4.0)
        pool.acquire(Holder("node1", 2), 60)
        done = pool.acquire(Holder("node2", 3), 60, waited=1.0)
        pool.release(done, "rotated")
        stats = admin.stats()
        assert stats.splitlines()[0].endswith(": 1 free, 2 leased")
        rows = {line.split()[0]: line.split() for line in stats.splitlines() if "node" in line}
        # host, held now, leases, requests, wait mean, wait max
        assert rows["node1"][:7] == ["node1", "2", "2", "0", "2.0", "s", "4.0"]
        assert rows["node2"][:4] == ["node2", "0", "1", "0"]


def test_unban_lifts_bans_and_enable_says_it_does_not(hub_url):  # noqa: F811
    """A ban ends at once with `unban`; `enable` only undoes `disable`, and says so."""
    ban = RestPolicy(ban_rest_seconds=600, jitter=0)
    holder = Holder("node1", 1)
    with Hub.open(hub_url) as hub:
        pool = ProxyPool(hub)
        admin = ProxyAdmin(pool)
        pool.add([f"http://127.0.0.1:{port}" for port in (3128, 3129, 3130)])
        for _ in range(3):
            pool.release(pool.acquire(holder, 60), "banned", UsageCounts(1, bans=1), ban)
        assert pool.acquire(holder, 60) is None, "all three banned"
        pool.set_enabled(1, False)
        said = admin.set_enabled("1", True)
        assert "enabled; it stays banned until" in said
        assert "does not lift a ban, `scrapy proxies unban 1` does" in said
        assert pool.acquire(holder, 60) is None, "enabling lifted no ban"
        assert "ban lifted" in admin.unban("http://127.0.0.1:3128")
        lease = pool.acquire(holder, 60)
        assert lease is not None and lease.proxy_id == 1
        assert "was not banned" in admin.unban("1")
        assert "enabled" in admin.set_enabled("1", True).split(";")[0]
        assert "stays banned" not in admin.set_enabled("1", True)
        assert admin.unban(None).startswith("lifted the ban of 2 proxies")
        assert {pool.acquire(holder, 60).proxy_id for _ in range(2)} == {2, 3}
        assert [p.consecutive_bans for p in pool.proxies()] == [0, 0, 0]
        assert "banned" not in admin.list()


def test_unban_command(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub) as opened:
        pool = ProxyPool(opened)
        pool.add(["http://bob:hunter2@127.0.0.1:3128", "http://127.0.0.1:3129"])
        ban = RestPolicy(ban_rest_seconds=600, jitter=0)
        for _ in range(2):
            pool.release(pool.acquire(HOLDER, 60), "banned", UsageCounts(1, bans=1), ban)
    one = scrapy("unban", "http://bob:***@127.0.0.1:3128", hub=hub)
    assert one.returncode == 0 and "ban lifted" in one.stdout and "hunter2" not in one.stdout
    every = scrapy("unban", "--all", hub=hub)
    assert every.returncode == 0 and "lifted the ban of 1 proxies" in every.stdout
    assert "banned" not in scrapy("list", hub=hub).stdout
    for args in (("unban",), ("unban", "1", "--all"), ("list", "--all")):
        wrong = scrapy(*args, hub=hub)
        assert wrong.returncode == 2 and ("unban" in wrong.stderr), (args, wrong.stderr)
    assert "unban ID|URL|--all" in scrapy("--help").stdout
