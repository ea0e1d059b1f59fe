"""Fixtures and helpers of the whole suite, and how it runs in parallel.

``make test`` runs the tests in several worker processes (pytest-xdist; see
``work_unit`` below for what goes where). A new test must be safe to run beside any
other, in this run and in another checkout's on the same machine:

- Ports: the OS picks them (port 0, ``tests.servers.free_port``), never a fixed one.
- Files: under ``tmp_path`` only, never in the checkout or ``$HOME``; a cache shared
  across runs is built under a file lock (``test_pywb.py``'s ``pywb_bin``).
- PostgreSQL: a schema of the test's own (``tests.hubs``); a server to stop or restart
  is a cluster of the test's own (``tests.pg_cluster``), never the shared one.
- Slurm: through the ``slurm_cluster`` fixture, in a ``test_slurm*.py`` module.
- Processes: stop what the test started, by its pid or process group, never by name.
- Environment and working directory: changed through ``monkeypatch`` only, and a
  subprocess is given ``cwd=`` and ``env=`` rather than the test's own being changed.
- A module that takes minutes: add it to ``LONG_FIRST`` (and to ``WHOLE`` when its tests
  share a costly module-scoped fixture).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from crawler import settings as project
from demo.site import DemoSite
from tests import launcher

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def site():
    demo = DemoSite(pages=400, page_bytes=3000)
    demo.start()
    yield demo
    demo.stop()


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


def project_settings(data_dir: Path, **overrides) -> dict:
    """The project's settings for an in-process crawler (``get_crawler``) on ``data_dir``."""
    values = {k: v for k, v in vars(project).items() if k.isupper()}
    values.update(
        DATA_DIR=str(data_dir),
        AUTOTHROTTLE_ENABLED=False,
        PROGRESS_INTERVAL=0,
        LOG_LEVEL="WARNING",
    )
    values.update(overrides)
    return values


def write_urls(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def crawl_command(urls: str | Path, data_dir: Path, *args: str, spider: str = "site") -> list[str]:
    return [
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        spider,
        "-a",
        f"urls={urls}",
        "-s",
        f"DATA_DIR={data_dir}",
        "-s",
        "AUTOTHROTTLE_ENABLED=0",
        "-s",
        "LOG_LEVEL=INFO",
        # Tests read counters in Scrapy's stats dump, logged at INFO only then.
        "-s",
        "LOG_QUIET=0",
        *args,
    ]


def run_crawl(urls, data_dir, *args, timeout=180, stdin=None, spider="site", env=None, **kwargs):
    """Run a crawl in a process of its own from the project root; returns the
    CompletedProcess."""
    return launcher.run(
        crawl_command(urls, data_dir, *args, spider=spider),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        env=env or crawl_env(),
        **kwargs,
    )


def crawl_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env


def start_crawl(urls, data_dir, *args, log_path: Path):
    """Start a crawl in its own process group (so a test can kill all of it)."""
    return launcher.start(
        crawl_command(urls, data_dir, *args),
        log=log_path,
        cwd=ROOT,
        env=crawl_env(),
        new_session=True,
    )


def kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(timeout=60)


# Under pytest-xdist (make test), the order collected is the order handed out: long
# modules first, by their time in a whole run, so that no worker starts a long test when
# the others are nearly done. Their tests go each to the next free worker, except those
# of WHOLE; every other module is one unit, as are all the Slurm tests (test_slurm*.py:
# one test cluster, made once, on one worker).
LONG_FIRST = [
    "test_slurm", "test_slurm_queue", "test_slurm_requeue", "test_slurm_procs",
    "test_docs_commands", "test_report", "test_cluster", "test_make_demo", "test_reparse",
    "test_bad_data_dirs", "test_render", "test_faults", "test_start", "test_items_crash",
    "test_jobs", "test_job_checks", "test_crash", "test_proxies_command",
    "test_item_exports", "test_shell", "test_item_names", "test_failures", "test_hub",
    "test_outcomes", "test_signals", "test_render_promises", "test_read_nothing",
    "test_politeness",
]  # fmt: skip
# Long modules whose tests share a module-scoped fixture (a crawl, a browser, two runs
# of make demo), made once per worker that runs any of them.
WHOLE = {"test_make_demo", "test_report", "test_reparse"}


def _module(nodeid: str) -> str:
    return Path(nodeid.split("::", 1)[0]).stem


def work_unit(nodeid: str) -> str:
    """What pytest-xdist hands to one worker: a test of a long module, all the Slurm
    tests, or a whole module."""
    module = _module(nodeid)
    if module.startswith("test_slurm"):
        return "slurm"
    if module in LONG_FIRST and module not in WHOLE:
        return nodeid
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    rank = {name: n for n, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item.nodeid), len(rank)))
    for item in items:
        if "slurm_cluster" in item.fixturenames and not _module(item.nodeid).startswith(
            "test_slurm"
        ):
            raise pytest.UsageError(
                f"{item.nodeid}: a test of the Slurm cluster goes in a test_slurm*.py module "
                "(they share one worker and one cluster)"
            )


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    # The collected order is the order wanted (not xdist's largest unit first).
    config.option.loadscopereorder = False
    return WorkUnits(config, log)
