"""Third-party programs the tests run from virtualenvs of their own (pywb, wacz).

Each would bring libraries the project's processes should not have: pywb pins an older
cryptography and pyOpenSSL and brings brotlipy, whose ``brotli`` module replaces the one
Scrapy decodes with; wacz brings pydantic, which itemadapter imports in every process
that imports it when it is installed (a tenth of a second or more of each crawl's
start-up). A tool's venv is built once under the user's cache directory, under a lock
(concurrent runs must not build it at once), with uv where the project's venv has it
(seconds) and pip otherwise.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.servers import need


def tool_venv(name: str) -> Path:
    """Where tool ``name``'s virtualenv lives: ``<NAME>_VENV``, or the user's cache."""
    if os.environ.get(f"{name.upper()}_VENV"):
        return Path(os.environ[f"{name.upper()}_VENV"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "research-crawler" / f"{name}-venv"


def _ways(venv: Path, package: str) -> list[list[list[str]]]:
    """The commands that build the venv: with uv where the project's venv has it, then
    with pip (which reads pip.conf: a machine whose index only pip knows)."""
    ways = []
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        python = str(venv / "bin" / "python")
        ways.append(
            [
                [str(uv), "venv", "-q", "--allow-existing", "--python", sys.executable, str(venv)],
                [str(uv), "pip", "install", "-q", "--python", python, package],
            ]
        )
    ways.append(
        [
            # No --clear: a venv named by <NAME>_VENV may be the user's own.
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", package],
        ]
    )
    return ways


def _run(steps: list[list[str]]) -> str | None:
    """None, or what went wrong."""
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        if done.returncode != 0:
            return done.stderr.strip()[-500:]
    return None


def tool_bin(name: str, package: str, program: str) -> Path:
    """The bin directory of tool ``name``'s virtualenv, ``package`` installed in it;
    ``program`` is what it must hold (the venv is built again when it does not)."""
    venv = tool_venv(name)
    bin_dir = venv / "bin"
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        need(f"cannot create {venv.parent} for {name}'s virtualenv: {exc}")
    with open(venv.parent / f"{name}-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (bin_dir / program).exists():
            return bin_dir
        ours = not venv.exists()
        problems = []
        for steps in _ways(venv, package):
            problem = _run(steps)
            if problem is None and (bin_dir / program).exists():
                return bin_dir
            problems.append(problem or f"no {program} in it")
            if ours:  # a half-built venv would pass for a built one next time
                shutil.rmtree(venv, ignore_errors=True)
        need(f"cannot install {package} into {venv}: {' / '.join(problems)}")
    raise AssertionError("need() does not return")


def wacz_program() -> Path:
    """The ``wacz`` program (``wacz validate`` checks what ``scrapy catalog wacz`` writes)."""
    return tool_bin("wacz", "wacz", "wacz") / "wacz"
