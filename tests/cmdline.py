"""Run project commands in a process of their own, as a user would (with a timeout)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import ROOT, crawl_env
from tests.launcher import run_scrapy_argv


def run_scrapy(*args: str, timeout: float = 300, pythonpath: list[Path] = (), input=None, env=None):
    env = {**crawl_env(), **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, pythonpath)])
    return run_scrapy_argv(args, cwd=ROOT, env=env, input=input, timeout=timeout)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def canon(items: list[dict]) -> list[str]:
    """Items as sorted JSON strings: equal lists mean equal items, whatever the order."""
    return sorted(json.dumps(i, sort_keys=True) for i in items)
