"""Every tool besides the scrapy commands (``python -m slurm.task``, ``slurm/submit``,
``python -m demo.site``, the benchmarks) has ``-h`` that reads in an 80-column
terminal: plain text, its docstring's paragraphs and examples kept apart."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BENCHMARKS = sorted(
    f"benchmarks.{p.stem}"
    for p in (ROOT / "benchmarks").glob("*.py")
    if "ArgumentParser(" in p.read_text()
)
TOOLS = [
    [sys.executable, "-m", "slurm.task"],
    [sys.executable, "-m", "slurm.ship"],
    [sys.executable, "-m", "demo.site"],
    [sys.executable, str(ROOT / "slurm" / "submit")],
    *([sys.executable, "-m", name] for name in BENCHMARKS),
]
# reST a docstring may hold: ``code``, :class:`x`, :mod:`x`, ...
MARKUP = re.compile(r"``|:[a-z]+:`")


@pytest.mark.parametrize("command", TOOLS, ids=lambda c: c[-1].rsplit("/", 1)[-1])
def test_tool_help_reads_in_80_columns(command):
    result = subprocess.run(
        [*command, "-h"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert not MARKUP.search(result.stdout), result.stdout
    # A paragraph of text is at most half a screen: a long docstring keeps its
    # paragraphs (an indented table or example may run longer).
    prose = re.findall(r"(?:^[^\s].*\n)+", result.stdout, re.MULTILINE)
    assert max(len(p.splitlines()) for p in prose) <= 16, result.stdout


def test_the_task_help_keeps_its_examples_and_paragraphs():
    result = subprocess.run(
        [sys.executable, "-m", "slurm.task", "-h"], cwd=ROOT, capture_output=True,
        text=True, timeout=120, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    text = result.stdout
    assert "\n    python -m slurm.task --urls URLS --data DATA --stage STAGE" in text, text
    assert "shard I*P+k of N*P" in text and "slurm.forkserver" in text
