"""A fork server for a task's crawl processes: Scrapy, Twisted and the project's
components imported once, every crawl forked from that.

A crawl process spends over a second of CPU importing Scrapy, Twisted and the
project before it sends its first request; a task starting ``--procs`` of them on a
node's few cores waited several seconds for them all. :class:`ForkServer` starts one
process (``python -m slurm.forkserver``) that imports all of it once (:func:`preload`),
then forks a child per crawl. The child is a process of its own, as a plain one:

- its working directory, environment (``PYTHONPATH`` included) and ``sys.argv`` are
  the crawl's; its stdin is ``/dev/null``, its stdout and stderr the crawl's log file
  (or files of the caller's choice);
- it runs ``python -m MODULE ARGS`` as the interpreter would (``runpy``), ends as the
  interpreter does (threads joined, ``atexit``, stdout and stderr flushed) but without
  tearing down its modules (:func:`finish`), and its exit status, or the signal that
  killed it, reaches the task as ``Popen.returncode`` would;
- it takes signals from the task by its pid (SIGTERM: graceful stop, a second: at
  once), and a ``kill -9`` ends it alone.

The task starts the server through ``subprocess`` (so, unlike forking the task itself,
a child copies no hub connection or thread of the task); the server forks only from
its single thread. Imports that would make forking unsafe are refused: when one
installs a Twisted reactor (the child must install the asyncio reactor itself) or
starts a thread, the server answers that it is unusable and the task starts its crawls
as plain processes, with one warning naming why.

The server ignores the stop signals (Slurm sends SIGTERM to every process of a job;
the crawls decide, the server only outlives them) and ends when the task closes its
stdin. Protocol, one JSON object a line: task -> server ``{"argv", "cwd", "env",
"log"}``; server -> task ``{"ready": true}`` (or ``{"ready": false, "why": ...}``)
once, ``{"pid": N}`` per request, ``{"exited": N, "status": S}`` when a child ends.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
CLASS_PATH = re.compile(r"[a-z_][\w]*(\.[a-z_]\w*)*\.[A-Za-z_]\w*")
COMPONENTS = (
    "DOWNLOADER_MIDDLEWARES",
    "SPIDER_MIDDLEWARES",
    "ITEM_PIPELINES",
    "EXTENSIONS",
    "DOWNLOAD_HANDLERS",
    "ADDONS",
)
REACTOR = "twisted.internet.reactor"
# Imported by a crawl when it starts, though no setting names them (-X importtime of a
# forked crawl: the TLS context factory alone was 0.3 s).
LATE_IMPORTS = (
    "scrapy.core.downloader.contextfactory",
    "scrapy.core.downloader.handlers._base_http",
    "scrapy.utils._download_handlers",
    "crawler.spiderkit.jobqueue",
)


class ForkServerError(Exception):
    """The fork server cannot start crawls: they start as plain processes."""


# --- the server's side ---------------------------------------------------------------


def component_modules(settings) -> list[str]:
    """The modules a crawl with ``settings`` loads its components from: the component
    dicts' entries and every setting that names a class (``module.Class``)."""
    paths: list[str] = []
    for name in COMPONENTS:
        paths += [p for p, order in settings.getwithbase(name).items() if order is not None]
    paths += [value for _, value in settings.items() if isinstance(value, str)]
    modules = {
        p.rpartition(".")[0] for p in paths if isinstance(p, str) and CLASS_PATH.fullmatch(p)
    }
    return sorted(modules)


def preload() -> str:
    """Import what every crawl imports; return why forking is unsafe ("" if it is not)."""
    import scrapy.cmdline  # noqa: F401 - the command line and what it imports
    import twisted.internet.asyncioreactor  # noqa: F401 - defines the reactor, installs none
    from scrapy.crawler import AsyncCrawlerProcess  # noqa: F401
    from scrapy.utils.misc import walk_modules_iter
    from scrapy.utils.project import get_project_settings

    settings = get_project_settings()
    packages = ["scrapy.commands", settings.get("COMMANDS_MODULE") or ""]
    packages += settings.getlist("SPIDER_MODULES")
    for name in [p for p in packages if p] + component_modules(settings) + [*LATE_IMPORTS]:
        try:
            if name in packages:
                list(walk_modules_iter(name))
            else:
                importlib.import_module(name)
        except Exception as exc:  # the crawl meets it again, and reports it
            logger.debug("Preloading %s failed: %s", name, exc)
        if REACTOR in sys.modules:
            return f"importing {name} installs a Twisted reactor"
    warm_up()
    if REACTOR in sys.modules:
        return "importing Scrapy installs a Twisted reactor"
    if threading.active_count() > 1:
        return f"the imports started threads: {[t.name for t in threading.enumerate()]}"
    return ""


def warm_up() -> None:
    """Load what every crawl loads on its first use of it: the Public Suffix List that
    the domain partition reads (~0.1 s of CPU a process)."""
    from crawler.domains import registered_domain

    registered_domain("www.example.com")


def send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def reap(children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        send({"exited": pid, "status": os.waitstatus_to_exitcode(status)})


def serve() -> dict | None:
    """Answer requests until the task closes stdin. Returns ``None`` in the server and
    the request in a child just forked."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    children: set[int] = set()
    buffer = b""
    while True:
        reap(children)
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            return None  # the task ended; the children go on as a plain process's would
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            request = json.loads(line)
            # A child in a session of its own says so before its pid is answered, as
            # Popen(start_new_session=True) returns once the child called setsid.
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                os.close(ready_r)
                if request.get("session"):
                    os.setsid()
                os.close(ready_w)
                return request
            os.close(ready_w)
            os.read(ready_r, 1)  # b"": the child closed its end
            os.close(ready_r)
            children.add(pid)
            send({"pid": pid})


def become(request: dict) -> None:
    """In a child just forked: become the crawl's process, and run it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = request["log"]
    for fd, path, flags in (
        (0, request.get("stdin") or os.devnull, os.O_RDONLY),
        (1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
        (2, request.get("stderr") or log, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # What PYTHONPATH puts on a fresh interpreter's path, when it differs from the server's.
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    argv = request["argv"]
    if argv[1:2] != ["-m"] or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        os.execvpe(argv[0], argv, request["env"])  # not ``python -m``: run it as it is
    import asyncio
    import runpy

    asyncio.set_event_loop_policy(None)  # a loop of its own, never the server's
    sys.argv = [argv[2], *argv[3:]]
    sys.path[0] = request["cwd"]  # as ``python -m`` puts the working directory first
    try:
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exit_code(exc.code)
    except KeyboardInterrupt:  # as the interpreter does: killed by SIGINT
        traceback.print_exc()
        finish(0, signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    finish(code)


def exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish(code: int, sig: int | None = None) -> NoReturn:
    """End a child as the interpreter ends a process, less its teardown
    (:func:`crawler.cli.exit_now`)."""
    from crawler.cli import exit_now

    exit_now(code, sig)


def main() -> None:
    # No logging set up here: a child's crawl sets up its own, as a plain process does.
    started = time.process_time()
    try:
        why = preload()
    except Exception as exc:
        why = f"preloading failed: {exc!r}"
    if why:
        send({"ready": False, "why": why})
        return
    send({"ready": True, "cpu": round(time.process_time() - started, 3)})
    request = serve()
    if request is None:  # the task closed stdin: end at once (no teardown to wait for)
        os._exit(0)
    become(request)  # the child: never returns


# --- the task's side -----------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its parent is gone, and nobody reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class ForkedProcess:
    """A crawl forked by the server, with the parts of ``subprocess.Popen`` a task uses."""

    def __init__(self, server: ForkServer, pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.read(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"crawl {self.pid}", timeout)
            self.server.read(timeout=left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            # ProcessLookupError: it ended, and the server has not said so yet.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The task's fork server: :meth:`start` it, then :meth:`spawn` each crawl."""

    UNKNOWN = 255  # the status of a crawl whose server died before it ended
    command = (sys.executable, "-m", "slurm.forkserver")  # -X importtime to measure

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.procs: dict[int, ForkedProcess] = {}
        self.pids: list[int] = []  # answers to spawn requests, in order
        # Statuses of children that ended before spawn() had their pid: on a loaded
        # machine the answer to a request and its child's exit come in one read.
        self.exited: dict[int, int] = {}
        self._buffer = b""
        self.ready_after = 0.0  # seconds from start to ready

    def start(self, timeout: float = 120.0, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> None:  # fmt: skip
        """Start the server (in ``cwd``, whose Scrapy project it preloads) and wait until
        it has preloaded; raises ForkServerError."""
        started = time.monotonic()
        self.proc = subprocess.Popen(
            list(self.command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=cwd or os.getcwd(),
            env=env,
            start_new_session=False,
        )
        message = self._message(timeout)
        if not message.get("ready"):
            self.close()
            raise ForkServerError(message.get("why", "it gave no answer"))
        self.ready_after = time.monotonic() - started
        logger.info(
            "Fork server (pid %d) ready in %.1f s (%.1f s of CPU importing)",
            self.proc.pid, self.ready_after, message.get("cpu", 0),
        )  # fmt: skip

    def spawn(self, argv: list[str], log: Path, cwd: Path | None = None,
              env: dict[str, str] | None = None, *, stdin: Path | None = None,
              stderr: Path | None = None, session: bool = False) -> ForkedProcess:  # fmt: skip
        """Fork a crawl running ``argv`` (``python -m MODULE ...``) with its stdout and
        stderr appended to ``log`` (stderr to ``stderr`` if given), reading ``stdin``
        (default ``/dev/null``); ``session``: in a session (and process group) of its
        own."""
        request = {
            "argv": [str(a) for a in argv],
            "cwd": str(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "log": str(log),
            "stdin": str(stdin or ""),
            "stderr": str(stderr or ""),
            "session": session,
        }
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise ForkServerError(f"the fork server is gone: {exc}") from exc
        deadline = time.monotonic() + 60
        while not self.pids:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ForkServerError("the fork server did not answer")
            self.read(timeout=deadline - time.monotonic())
        proc = ForkedProcess(self, self.pids.pop(0))
        proc.returncode = self.exited.pop(proc.pid, None)
        if proc.returncode is None:
            self.procs[proc.pid] = proc
        return proc

    def read(self, timeout: float | None) -> None:
        """Take in what the server said within ``timeout`` seconds (0: what it has said)."""
        if self.proc is None:
            return
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            return
        data = os.read(out.fileno(), 1 << 16)
        if not data:
            self._server_gone()
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "pid" in message:
                self.pids.append(message["pid"])
            elif "exited" in message:
                proc = self.procs.pop(message["exited"], None)
                if proc is None:
                    self.exited[message["exited"]] = message["status"]
                else:
                    proc.returncode = message["status"]

    def _message(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            data = os.read(self.proc.stdout.fileno(), 1 << 16) if ready else b""
            if not data:
                return {}
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _server_gone(self) -> None:
        """The server died (killed -9, say): its children live on, but their statuses
        are lost with it. Each is waited for by its pid and ends as UNKNOWN."""
        for pid, proc in list(self.procs.items()):
            if not alive(pid):
                logger.error("Crawl %d ended after the fork server died: status unknown", pid)
                proc.returncode = self.UNKNOWN
                del self.procs[pid]
        time.sleep(0.1)  # its pipe stays readable (at its end): do not spin

    def close(self) -> None:
        """Close the server's stdin (it ends); the crawls are not waited for."""
        if self.proc is None:
            return
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


if __name__ == "__main__":
    main()
