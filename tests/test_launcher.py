"""A command forked from the tests' fork server behaves as the same command in a fresh
interpreter: exit status, output, input, environment, extra import paths, timeouts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests import launcher
from tests.conftest import ROOT, crawl_env


def both(argv, **kwargs):
    env = {**crawl_env(), **kwargs.pop("env", {})}
    forked = launcher.run_scrapy_argv(argv, cwd=ROOT, env=env, **kwargs)
    fresh = subprocess.run(
        [sys.executable, "-m", "scrapy", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        **kwargs,
    )
    return forked, fresh


def test_exit_status_and_output_are_a_fresh_interpreters(tmp_path):
    missing = tmp_path / "missing"
    forked, fresh = both(["catalog", "stats", "-s", f"DATA_DIR={missing}"])
    assert fresh.returncode == 2, fresh.stderr
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    forked, fresh = both(["list"])
    assert fresh.returncode == 0 and "site" in fresh.stdout.split()
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)


def test_input_environment_and_import_paths_reach_the_command(tmp_path):
    # A spider of a module that only PYTHONPATH finds, reading its input from stdin.
    package = tmp_path / "elsewhere"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "echo.py").write_text(
        "import os, sys\n"
        "import scrapy\n\n\n"
        "class Echo(scrapy.Spider):\n"
        "    name = 'echo'\n\n"
        "    async def start(self):\n"
        "        print('read:', sys.stdin.read().strip(), os.environ['ECHO_WORD'])\n"
        "        return\n"
        "        yield\n"
    )
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "ECHO_WORD": "beside"}
    argv = ["crawl", "echo", "-s", "SPIDER_MODULES=elsewhere.echo", "-s", "LOG_LEVEL=ERROR"]
    argv += ["-s", f"DATA_DIR={tmp_path / 'data'}"]
    forked, fresh = both(argv, env=env, input="from stdin\n")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "read: from stdin beside" in fresh.stdout
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)


def test_a_command_past_its_timeout_is_killed(tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("")
    os.mkfifo(tmp_path / "never")
    with pytest.raises(subprocess.TimeoutExpired):
        # Reads a FIFO no one writes to: it waits until killed.
        launcher.run_scrapy_argv(
            ["crawl", "site", "-a", f"urls={tmp_path / 'never'}"],
            cwd=ROOT,
            env=crawl_env(),
            timeout=5,
        )


def test_a_crawl_started_in_a_session_of_its_own_dies_with_its_group(tmp_path):
    os.mkfifo(tmp_path / "never")
    proc = launcher.start(
        [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"urls={tmp_path / 'never'}"],
        log=tmp_path / "crawl.log",
        cwd=ROOT,
        env=crawl_env(),
        new_session=True,
    )
    try:
        assert os.getpgid(proc.pid) == proc.pid  # a group leader, as start_new_session
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
