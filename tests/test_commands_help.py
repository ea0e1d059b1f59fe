"""Every command of the project has help that reads in an 80-column terminal, and
meets bad arguments with one line and exit status 2."""

from __future__ import annotations

import re

import pytest

from tests.cmdline import run_scrapy
from tests.conftest import ROOT

COMMANDS = sorted(p.stem for p in (ROOT / "commands").glob("*.py") if p.stem != "__init__")
TERMINAL = {"COLUMNS": "80"}
# argparse's own sections, as Scrapy underlines them; any other underlined line is an
# option's help text taken for a heading.
HEADINGS = {"Usage", "Options", "Global Options"}
# The start of a line each command's help must have: its arguments, one a line (options
# are listed by argparse).
NAMED = {
    "catalog": [f"- {a}" for a in ("stats", "verify", "rebuild", "merge", "export", "index")]
    + ["- wacz", "- report"],
    "crawl": [f"- {a}=" for a in ("urls", "depth", "summaries", "revalidate", "render", "shard")]
    + [f"- {code}: " for code in (0, 75, 1, 2)],
    "job": [
        f"scrapy job {a}"
        for a in ("create NAME", "set NAME", "list", "show NAME", "top [NAME]", "serve [NAME]")
    ],
    "proxies": [f"scrapy proxies {a}" for a in ("add", "import", "list", "disable|enable")],
    "queue": [f"scrapy queue {a} NAME" for a in ("load", "status", "stats")],
    "reparse": ["scrapy reparse [options] <spider>", "--items-db FILE", "-a NAME=VALUE"],
    "shell": ["- `archive`", "- `offline`", "- `live`"],
}


def test_the_project_commands_are_listed():
    result = run_scrapy("-h", timeout=120, env=TERMINAL)
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert f"  {name}" in result.stdout, name
    assert [line for line in result.stdout.splitlines() if len(line) > 80] == []
    (catalog,) = [line for line in result.stdout.splitlines() if line.startswith("  catalog ")]
    assert "report" in catalog


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help_reads_in_80_columns(name):
    result = run_scrapy(name, "--help", timeout=120, env=TERMINAL)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"Usage\n=====\n  scrapy {name}" in text
    lines = text.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    headings = {
        lines[i - 1] for i, line in enumerate(lines) if i and re.fullmatch(r"[=-]{3,}", line)
    }
    assert headings <= HEADINGS, text
    for word in NAMED[name]:
        # Each on a line of its own, not run into a paragraph with the others.
        assert any(line.lstrip().startswith(word) for line in lines), (word, text)
    assert "Traceback" not in result.stderr


BAD = [
    (["catalog", "bogus"], "'bogus'"),
    (["catalog", "stats", "--bogus"], "'--bogus'"),
    (["catalog"], "give an action"),
    (["catalog", "report", "--watch", "0"], "--watch"),
    (["catalog", "export", "--format", "xls"], "--format"),
    (["crawl", "nosuch"], "'nosuch'"),
    (["crawl"], "spider name"),
    (["crawl", "site", "-a", "urls=-", "-s", "CONCURRENT_REQUESTS=abc"], "CONCURRENT_REQUESTS"),
    (["crawl", "site", "-a", "urls=-", "-s", "ROBOTSTXT_OBEY=maybe"], "ROBOTSTXT_OBEY"),
    (["job", "bogus"], "'bogus'"),
    (["proxies", "bogus"], "'bogus'"),
    (["queue", "bogus", "x"], "'bogus'"),
    (["reparse"], "spider name"),
    (["reparse", "site", "--limit", "many"], "--limit"),
    (["shell", "-s", "ARCHIVE_SHELL=bogus"], "ARCHIVE_SHELL"),
]


@pytest.mark.parametrize(("args", "named"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_get_one_line_and_exit_2(args, named, tmp_path):
    result = run_scrapy(*args, "-s", f"DATA_DIR={tmp_path / 'data'}", timeout=120, input="")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert named in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["catalog", "stats"], ["reparse", "site"]])
def test_tool_commands_print_no_version_banner(args, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    result = run_scrapy(*args, "-s", f"DATA_DIR={data}", timeout=120)
    assert "Scrapy 2." not in result.stderr + result.stdout
    assert "Versions" not in result.stderr + result.stdout
