"""Every command of the project has --help text."""

from __future__ import annotations

import pytest

from tests.cmdline import run_scrapy
from tests.conftest import ROOT

COMMANDS = sorted(p.stem for p in (ROOT / "commands").glob("*.py") if p.stem != "__init__")


def test_the_project_commands_are_listed():
    result = run_scrapy("-h", timeout=120)
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert f"  {name}" in result.stdout, name


@pytest.mark.parametrize("name", COMMANDS)
def test_command_has_help(name):
    result = run_scrapy(name, "--help", timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"Usage\n=====\n  scrapy {name}" in result.stdout
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) > 8
