"""Every command block of the README and the tutorial runs, as written, as a reader runs it.

Each page gets a fresh copy of the project (its files linked, no data directory), an
environment as a user has it after ``make install`` (``HOME``, a system ``PATH``,
nothing of the test's own) and the page's activation step; the page's blocks then run
one after the other in one shell, stopping at the first command that fails. The demo
site the pages start with ``python -m demo.site --port 8000`` is started on a port the
OS picks, and ``127.0.0.1:8000`` in the commands is replaced by it. Each page runs
alone, in a project of its own: a reader may take them in any order, so each page's
commands make what they read. What they make lands in the data directory (or is a URL
list): nothing else is left in the project's root.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.docblocks import Block, blocks

# Each entry: the pages run in one fresh project, in this order (one page each).
RUNS = {
    Path(page).stem: [page]
    for page in (
        "README.md",
        "docs/tutorial.md",
        "docs/how-to/crawling.md",
        "docs/how-to/reparse.md",
        "docs/how-to/catalog-tools.md",
        "docs/how-to/reading-data.md",
        "docs/how-to/rendering.md",
        "docs/how-to/watching.md",
        "docs/how-to/proxies-and-jobs.md",
        "docs/how-to/slurm.md",
    )
}
# The pages the runs above include: their sh blocks run unless marked.
CHECKED = sorted({page for pages in RUNS.values() for page in pages})
# Every page: a language on each fence, so that a command block cannot pass for text.
EVERY_PAGE = sorted(
    ["README.md", *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
)
# Marked blocks of the checked pages, at most: the rule is that documented commands run.
MAX_SKIPPED = 6
DOCUMENTED_PORT = "8000"
NOT_COPIED = {".git", "data", "demo-data", "bench-data", "site", "urls.txt", "product_urls.txt"}


def page_blocks(pages: list[str]) -> list[Block]:
    return [block for page in pages for block in blocks(ROOT / page)]


def user_env() -> dict[str, str]:
    """The environment of a fresh login shell: no virtualenv, no PYTHONPATH; the
    machine's own certificate authorities where it names them (a page's `uvx` fetches
    its tool from the package index)."""
    env = {"HOME": os.environ["HOME"], "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    kept = ("TMPDIR", "USER", "SSL_CERT_FILE", "SSL_CERT_DIR")
    env.update({k: os.environ[k] for k in kept if k in os.environ})
    return env


def fresh_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_COPIED and not entry.name.endswith("_cache"):
            (project / entry.name).symlink_to(entry)
    return project


def start_site(block: Block, project: Path) -> tuple[subprocess.Popen, str]:
    command = block.text.replace(f"--port {DOCUMENTED_PORT}", "--port 0").strip()
    log = project.parent / "site.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", "-c", f". .venv/bin/activate && exec {command}"],
            cwd=project,
            env=user_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while b"\n" not in log.read_bytes() and server.poll() is None:
        assert time.monotonic() < deadline, f"{block.where}: the server printed no URL in 60 s"
        time.sleep(0.05)
    first = log.read_text().partition("\n")[0].strip()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", first), (
        f"{block.where}: the server printed {log.read_text()[-2000:]!r}, not its URL"
    )
    return server, first.removeprefix("http://")


def script(run: list[Block], address: str) -> str:
    lines = ["set -e"]
    for block in run:
        lines.append(f"echo {shlex.quote('::block ' + block.where)}")
        lines.append(block.text.replace(f"127.0.0.1:{DOCUMENTED_PORT}", address))
    return "\n".join(lines) + "\n"


def last_block(output: str) -> str:
    marks = re.findall(r"^::block (\S+)$", output, re.MULTILINE)
    return marks[-1] if marks else "(before the first block)"


@pytest.mark.parametrize("run_name", sorted(RUNS))
def test_documented_commands_run(run_name, tmp_path):
    found = page_blocks(RUNS[run_name])
    servers = [b for b in found if b.lang == "sh" and b.mode == "background"]
    run = [b for b in found if b.lang == "sh" and b.mode == "run"]
    assert len(servers) == 1, f"{RUNS[run_name][0]}: expected one server block, found {servers}"
    project = fresh_project(tmp_path)
    server, address = start_site(servers[0], project)
    try:
        result = subprocess.run(
            ["bash", "-c", script(run, address)],
            cwd=project,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert result.returncode == 0, (
        f"the command block at {last_block(result.stdout)} failed with exit status "
        f"{result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    )
    left = {p.name for p in project.iterdir() if not p.is_symlink()}
    strays = {name for name in left if name != "data" and not name.endswith(".txt")}
    assert not strays, f"{RUNS[run_name][0]}'s commands left {sorted(strays)} in the project"


@pytest.mark.parametrize("page", EVERY_PAGE)
def test_every_block_is_classified(page):
    for block in blocks(ROOT / page):
        assert block.lang, f"{block.where}: give the code block a language (sh for commands)"
        if block.mode == "skip":
            assert block.why, f"{block.where}: say why the block is skipped"


def test_few_blocks_are_skipped():
    skipped = [b for b in page_blocks(CHECKED) if b.lang == "sh" and b.mode == "skip"]
    assert len(skipped) <= MAX_SKIPPED, "documented commands are run by a test: " + ", ".join(
        f"{b.where} {b.why}" for b in skipped
    )
