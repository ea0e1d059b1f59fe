"""Run ``python -m scrapy ...`` in a process forked from one that imported Scrapy once.

A command run by a test is a process of its own, as a user's would be: its own exit
status, output, input, environment and files. What it does not need is a fresh
interpreter importing Scrapy, Twisted and the project again (~1 s of CPU each time, the
largest part of most command tests on a 2-core machine). Each test worker starts one
:class:`slurm.forkserver.ForkServer` (the one Slurm tasks start their crawls from) and
forks every ``python -m scrapy`` command from it; a server that cannot be used (it says
why) leaves the commands to fresh interpreters, as does ``TEST_FRESH_INTERPRETERS=1``.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from slurm.forkserver import ForkServer, ForkServerError

ROOT = Path(__file__).resolve().parent.parent

_server: ForkServer | None = None
_unusable = ""


def fork_server() -> ForkServer | None:
    """This worker's fork server, started on first use; None when it cannot be used."""
    global _server, _unusable
    if _server is None and not _unusable:
        server = ForkServer()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        try:
            server.start(cwd=ROOT, env=env)
        except ForkServerError as exc:
            _unusable = str(exc)
            print(f"tests.launcher: commands start fresh interpreters: {exc}", file=sys.stderr)
            return None
        atexit.register(server.close)
        _server = server
    return _server


def fresh_interpreters() -> bool:
    return os.environ.get("TEST_FRESH_INTERPRETERS", "") not in ("", "0")


def run(command: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, ...)``: a ``python -m
    scrapy`` command is forked from the fork server, any other run as it is."""
    command = list(command)
    known = {"cwd", "env", "input", "timeout", "check", "capture_output", "text"}
    if (
        command[:3] != [sys.executable, "-m", "scrapy"]
        or not kwargs.get("capture_output")
        or not kwargs.get("text")
        or set(kwargs) - known
    ):
        return subprocess.run(command, **kwargs)
    result = run_scrapy_argv(
        command[3:],
        cwd=kwargs.get("cwd") or os.getcwd(),
        env=kwargs.get("env") or dict(os.environ),
        input=kwargs.get("input"),
        timeout=kwargs.get("timeout"),
    )
    if kwargs.get("check"):
        result.check_returncode()
    return result


def run_scrapy_argv(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike,
    env: dict[str, str],
    input: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "scrapy", *argv], capture_output=True,
    text=True, ...)``, forked from the fork server."""
    command = [sys.executable, "-m", "scrapy", *argv]
    server = None if fresh_interpreters() else fork_server()
    if server is None:
        return subprocess.run(
            command, cwd=cwd, env=env, input=input, timeout=timeout, capture_output=True, text=True
        )
    with tempfile.TemporaryDirectory(prefix="scrapy-run-") as tmp:
        stdin, stdout, stderr = (Path(tmp) / name for name in ("stdin", "stdout", "stderr"))
        stdin.write_text(input or "", encoding="utf-8")
        proc = server.spawn(command, stdout, Path(cwd), dict(env), stdin=stdin, stderr=stderr)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            raise subprocess.TimeoutExpired(
                command, timeout, stdout.read_bytes(), stderr.read_bytes()
            ) from None
        out, err = (p.read_text(encoding="utf-8", errors="replace") for p in (stdout, stderr))
    return subprocess.CompletedProcess(command, code, out, err)


def start(
    command: Sequence[str],
    *,
    log: Path,
    cwd: str | os.PathLike,
    env: dict[str, str],
    new_session: bool = False,
):
    """``subprocess.Popen(command, stdout=log, stderr=STDOUT, ...)`` with ``log``
    truncated first: a ``python -m scrapy`` command is forked from the fork server (a
    :class:`slurm.forkserver.ForkedProcess`: ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``terminate``, ``kill``, ``returncode``), any other started as it is."""
    command = list(command)
    server = None
    if command[:3] == [sys.executable, "-m", "scrapy"] and not fresh_interpreters():
        server = fork_server()
    if server is None:
        with open(log, "w") as out:
            return subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )
    Path(log).write_bytes(b"")
    return server.spawn(command, Path(log), Path(cwd), dict(env), session=new_session)
