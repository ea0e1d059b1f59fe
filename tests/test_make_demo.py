"""``make demo``, the README's first command, run as written in a copy of the project.

The copy has its own ``demo/`` (``demo/run.py`` finds the project root from its own
path, so a linked one would write the checkout's ``demo-data/``) and links the rest,
the virtualenv included: ``make`` finds it installed and goes straight to the demo.
It runs twice: the second run is the resume the demo's output promises, and fetches
nothing the first one stored.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

NOT_LINKED = {".git", "demo", "demo-data", "data", "bench-data", "site"}


def project_copy(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED and not entry.name.endswith("_cache"):
            (project / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "demo", project / "demo", ignore=shutil.ignore_patterns("__pycache__"))
    return project


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_demo(project: Path, port: int) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(Path.home()),
        "LANG": "C.UTF-8",
        "DEMO_PORT": str(port),
    }
    return subprocess.run(
        ["make", "demo"], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )


def outcomes(log: Path) -> list[str]:
    return [json.loads(line)["outcome"] for line in log.read_text().splitlines()]


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("make demo needs the project's virtualenv: run make install first")
    project = project_copy(tmp_path_factory.mktemp("make-demo"))
    port = free_port()
    first = make_demo(project, port)
    log = project / "demo-data" / "fetch_log.jsonl"
    first_outcomes = outcomes(log) if log.exists() else []
    second = make_demo(project, port)
    return project, first, first_outcomes, second


def test_make_demo_crawls_the_site_and_says_what_the_catalog_holds(demo_runs):
    project, first, first_outcomes, _ = demo_runs
    assert first.returncode == 0, (
        f"make demo failed:\n{first.stdout[-3000:]}\n{first.stderr[-3000:]}"
    )
    assert "What the catalog holds" in first.stdout
    catalog = project / "demo-data" / "metadata.db"
    with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT count(*) FROM artifacts WHERE status = 200").fetchone()[0]
    # 20 listed start pages, depth 3 over a site of 3,000 linked pages.
    assert rows > 1000, f"only {rows} pages stored with status 200"
    assert first_outcomes.count("ok") >= rows


def test_a_second_make_demo_resumes_and_fetches_nothing_stored(demo_runs):
    project, _, first_outcomes, second = demo_runs
    assert second.returncode == 0, f"{second.stdout[-3000:]}\n{second.stderr[-3000:]}"
    log = project / "demo-data" / "fetch_log.jsonl"
    new = outcomes(log)[len(first_outcomes) :]
    assert new, "the second run wrote no action-log line"
    assert "ok" not in new, f"the resumed demo fetched and stored again: {new.count('ok')} pages"
