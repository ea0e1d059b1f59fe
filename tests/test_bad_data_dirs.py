"""Every command of the project against a data directory it cannot use: a file, a
read-only directory, a metadata.db that is text, a directory that does not exist. Each
says so in one line naming the path, exits 1 or 2, and prints no traceback."""

from __future__ import annotations

import subprocess

import pytest

from tests.cmdline import run_scrapy
from tests.conftest import write_urls

KINDS = ("file", "read-only", "text-catalog", "missing")


@pytest.fixture(params=KINDS)
def bad_dir(request, tmp_path):
    path = tmp_path / "data"
    kind = request.param
    if kind == "file":
        path.write_text("not a directory\n")
    elif kind == "text-catalog":
        path.mkdir()
        (path / "metadata.db").write_text("not a database\n")
    elif kind == "read-only":
        # Root ignores permission bits: a read-only mount is read-only for root too.
        path.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
        request.addfinalizer(lambda: subprocess.run(["umount", str(path)], check=True))
    yield kind, path


def commands(site, tmp_path) -> list[tuple[str, ...]]:
    out = tmp_path / "out"
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/1.html"])
    return [
        ("catalog", "stats"),
        ("catalog", "verify"),
        ("catalog", "rebuild", "-o", f"{out}.db"),
        ("catalog", "export", "-o", f"{out}.parquet"),
        ("catalog", "export", "--table", "t", "--format", "csv", "-o", f"{out}.csv"),
        ("catalog", "index", "-o", f"{out}.cdxj"),
        ("catalog", "wacz", f"{out}.wacz"),
        ("catalog", "report", "-o", f"{out}.html"),
        ("reparse", "site"),
        ("reparse", "site", "-o", f"{out}.jsonl"),
        ("shell", "-s", "ARCHIVE_SHELL=offline", f"{site.base_url}/page/1.html"),
        ("job", "list"),
        ("proxies", "list"),
        ("crawl", "site", "-a", f"urls={urls}"),
    ]


# Neither reads DATA_DIR: they say that no hub is set.
HUB_COMMANDS = ("job", "proxies")


def test_every_command_meets_a_bad_data_dir_with_one_line(site, tmp_path, bad_dir):
    kind, path = bad_dir
    for command in commands(site, tmp_path):
        result = run_scrapy(*command, "-s", f"DATA_DIR={path}", "-s", "LOG_LEVEL=ERROR")
        said = result.stdout + result.stderr
        assert "Traceback" not in said, (command, said[-3000:])
        if command[0] == "crawl" and kind == "missing":
            # The first crawl into a new data directory creates it.
            assert result.returncode == 0, (command, said[-3000:])
            continue
        if command[1] == "report" and kind == "read-only":
            # An empty data directory has an empty report.
            assert result.returncode == 0, (command, said[-3000:])
            continue
        assert result.returncode in (1, 2), (command, result.returncode, said[-3000:])
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1, (command, result.stderr[-3000:])
        if command[0] not in HUB_COMMANDS:
            assert str(path) in errors[0], (command, errors)
    if kind == "missing":
        assert not (path / "metadata.db").exists() or (path / "archive").exists()


@pytest.fixture
def read_only_copy(site, tmp_path, request):
    """A crawled data directory (with an item table), copied as a user copies one (its
    catalog without -wal or -shm) onto a mount that is read-only for everyone."""
    import shutil

    from tests.conftest import run_crawl
    from tests.servers import need

    crawled = tmp_path / "crawled"
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/{n}.html" for n in range(5)])
    done = run_crawl(urls, crawled, "-a", "summaries=1")
    assert done.returncode == 0, done.stderr[-3000:]
    source, mount = tmp_path / "source", tmp_path / "mnt"
    shutil.copytree(crawled, source / "data", ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    mount.mkdir()
    for args in (["--bind", str(source), str(mount)], ["-o", "remount,bind,ro", str(mount)]):
        mounted = subprocess.run(["mount", *args], capture_output=True, text=True)
        if mounted.returncode != 0:
            subprocess.run(["umount", str(mount)], capture_output=True)
            need(f"a read-only bind mount (mount as root): {mounted.stderr.strip()}")
    request.addfinalizer(lambda: subprocess.run(["umount", str(mount)], check=True))
    return mount / "data"


def test_a_read_only_data_directory_is_read_by_every_reading_command(
    site, tmp_path, read_only_copy
):
    data = ("-s", f"DATA_DIR={read_only_copy}")
    out = tmp_path / "out"
    page = f"{site.base_url}/page/3.html"
    for command, said in (
        (("catalog", "stats"), "page_summary"),
        (("catalog", "verify"), "checked 5 rows: 0 unreadable"),
        (("catalog", "export", "-o", f"{out}.parquet"), "exported 5 rows"),
        (("catalog", "export", "--table", "page_summary", "-o", f"{out}.csv", "--format", "csv"),
         "exported 5 rows"),
        (("catalog", "wacz", f"{out}.wacz"), "wrote"),
        (("catalog", "report", "-o", f"{out}.html"), "wrote"),
        (("catalog", "rebuild", "-o", f"{out}.db"), "5 rows"),
        (("reparse", "site", "-o", f"{out}.jsonl"), "output:"),
        (("shell", page, "-c", "response.status", "-s", "ARCHIVE_SHELL=offline"), "200"),
    ):  # fmt: skip
        result = run_scrapy(*command, *data)
        assert result.returncode == 0, (command, result.stdout + result.stderr[-3000:])
        assert said in result.stdout + result.stderr, (command, result.stdout, result.stderr)
    # Where a command would write into it by default: one line naming the place.
    for command in (("catalog", "export"), ("catalog", "index"), ("catalog", "rebuild")):
        result = run_scrapy(*command, *data)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and str(read_only_copy) in line, line
        assert "-o" in line, line
