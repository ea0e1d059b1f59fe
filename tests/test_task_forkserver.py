"""A task's crawls forked from its fork server (``slurm/forkserver.py``): each is a
process of its own (directory, environment, log, exit status, signals), Scrapy is
imported once, and ``--no-fork-server`` starts plain processes as before."""

from __future__ import annotations

import array
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from slurm.forkserver import ForkServer, alive
from tests.conftest import ROOT, kill_group, write_urls
from tests.hostservers import HostServers

CHILD = """\
import json, os, signal, sys, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "mark": os.environ.get("MARK"),
                  "preloaded": "scrapy.crawler" in sys.modules,
                  "reactor": "twisted.internet.reactor" in sys.modules}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
import atexit, threading
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread ended", flush=True))).start()
if sys.argv[1] == "wait":  # a graceful stop on SIGTERM, as a crawl's
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(sys.argv[2])))
    while True:
        time.sleep(0.05)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def server():
    forks = ForkServer()
    forks.start()
    yield forks
    forks.close()


@pytest.fixture
def child(tmp_path) -> Path:
    (tmp_path / "forkchild.py").write_text(CHILD)
    return tmp_path


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines()


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_project_preloads_without_installing_a_reactor(server):
    """The server refuses to fork when an import installed a reactor (or started a
    thread): the project's modules must not."""
    assert server.proc.poll() is None


def test_a_forked_child_runs_in_its_directory_environment_and_log(server, child):
    env = {**os.environ, "MARK": "m1"}
    log = child / "child.log"
    proc = server.spawn([sys.executable, "-m", "forkchild", "exit", "3"], log, child, env)
    assert ppid(proc.pid) == server.proc.pid
    assert proc.wait(timeout=30) == 3
    said = json.loads(lines(log)[0])
    assert said == {"argv": ["exit", "3"], "cwd": str(child), "mark": "m1",
                    "preloaded": True, "reactor": False}  # fmt: skip
    # Ended as the interpreter ends: its threads joined, then its atexit functions.
    assert lines(log)[1:] == ["to stderr", "thread ended", "atexit ran"]
    # Not ``python -m``: run as it is, in its directory, environment and log.
    shell = server.spawn(["/bin/sh", "-c", 'echo "$MARK $PWD"; exit 4'], log, child, env)
    assert shell.wait(timeout=30) == 4
    assert lines(log)[-1] == f"m1 {child}"


def test_a_child_that_ends_before_its_pid_is_read_keeps_its_status(server, child):
    # On a loaded machine the server's answer (the pid) and the child's exit arrive in
    # one read: the task must still learn how the child ended.
    read = server.read
    longest_pid_answer = len(json.dumps({"pid": 2**22}) + "\n")  # pid_max's ceiling

    def late_read(timeout):
        # The first read waits until the child's exit is in the pipe behind its pid.
        out, waiting = server.proc.stdout.fileno(), array.array("i", [0])
        deadline = time.monotonic() + 30
        while waiting[0] <= longest_pid_answer and time.monotonic() < deadline:
            time.sleep(0.01)
            fcntl.ioctl(out, termios.FIONREAD, waiting)
        assert waiting[0] > longest_pid_answer, "the child's exit never came"
        server.read = read
        read(timeout)

    server.read = late_read
    proc = server.spawn(["/bin/sh", "-c", "exit 5"], child / "a.log", child)
    assert proc.wait(timeout=10) == 5
    assert not server.exited


def test_each_child_takes_its_own_signals_and_the_server_ignores_stop_signals(server, child):
    args = [sys.executable, "-m", "forkchild", "wait"]
    killed = server.spawn([*args, "0"], child / "a.log", child)
    stopped = server.spawn([*args, "75"], child / "b.log", child)
    for log in (child / "a.log", child / "b.log"):  # both running their module
        deadline = time.monotonic() + 30
        while not (log.exists() and log.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    # Slurm sends SIGTERM (and a user's Ctrl-C, SIGINT) to every process of the job.
    os.kill(server.proc.pid, signal.SIGTERM)
    os.kill(server.proc.pid, signal.SIGINT)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(timeout=30) == -signal.SIGKILL
    time.sleep(0.5)
    assert stopped.poll() is None  # the other one lives on
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=30) == 75
    assert server.proc.poll() is None


def test_crawls_outlive_a_dead_server_and_end_as_unknown(server, child):
    proc = server.spawn([sys.executable, "-m", "forkchild", "wait", "0"], child / "a.log", child)
    os.kill(server.proc.pid, signal.SIGKILL)
    time.sleep(0.5)
    assert proc.poll() is None  # still running: not reported ended
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == ForkServer.UNKNOWN


def run_task(
    tmp_path: Path,
    hosts: HostServers,
    *options: str,
    per_host: int = 30,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    urls = hosts.urls("a.test", per_host) + hosts.urls("b.test", per_host)
    cmd = [sys.executable, "-m", "slurm.task", "--urls", str(write_urls(tmp_path / "urls.txt", urls)),
           "--data", str(tmp_path / "data"), "--stage", str(tmp_path / "stage"), "--task", "0",
           "--tasks", "1", "--procs", "2", "--name", "t0", "--partition", "url", *options, "--",
           "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "ROBOTSTXT_OBEY=0", "-s", "DOWNLOAD_DELAY=0",
           "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1", *hosts.setting_args()]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("CRAWL_FORK_SERVER", None)
    with open(tmp_path / "task.log", "w") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def crawl_pids(tmp_path: Path, hosts: HostServers, task: subprocess.Popen) -> list[int]:
    """The pids of the task's two crawls, once both are fetching."""
    deadline = time.monotonic() + 120
    while True:
        text = (tmp_path / "task.log").read_text()
        pids = [int(p) for p in re.findall(r"Crawl p\d \(pid (\d+)\)", text)]
        if len(pids) == 2 and all(server.hits() >= 4 for server in hosts):
            return pids
        assert task.poll() is None and time.monotonic() < deadline, text
        time.sleep(0.1)


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "plain"])
def test_usr1_stops_every_crawl_gracefully_and_ships(tmp_path, fork_server):
    with HostServers(["a.test", "b.test"], latency=0.3) as hosts:
        task = run_task(tmp_path, hosts, "--fork-server" if fork_server else "--no-fork-server")
        try:
            pids = crawl_pids(tmp_path, hosts, task)
            text = (tmp_path / "task.log").read_text()
            servers = re.findall(r"Fork server \(pid (\d+)\) ready", text)
            parent = int(servers[0]) if fork_server else task.pid
            assert [ppid(pid) for pid in pids] == [parent, parent], text
            os.kill(task.pid, signal.SIGUSR1)
            assert task.wait(timeout=120) == 75, (tmp_path / "task.log").read_text()
        finally:
            kill_group(task)
        fetched = sum(server.hits() for server in hosts)
    text = (tmp_path / "task.log").read_text()
    assert "Crawl exit statuses: [75, 75]" in text, text
    assert fetched < 60
    for k in range(2):
        log = (tmp_path / "data" / "logs" / f"t0_p{k}.log").read_text()
        assert "shutting down gracefully" in log, log
        assert "Spider closed (shutdown)" in log, log
        assert (tmp_path / "data" / "catalogs" / f"t0_p{k}.db").exists()


def test_a_crawl_killed_9_ends_alone_and_is_shipped_while_the_others_crawl(tmp_path):
    with HostServers(["a.test", "b.test"], latency=0.3) as hosts:
        task = run_task(tmp_path, hosts, per_host=40)
        try:
            pids = crawl_pids(tmp_path, hosts, task)
            os.kill(pids[0], signal.SIGKILL)
            shipped = tmp_path / "data" / "catalogs" / "t0_p0.db"
            deadline = time.monotonic() + 30
            while not shipped.exists():
                assert time.monotonic() < deadline, (tmp_path / "task.log").read_text()
                time.sleep(0.05)
            assert alive(pids[1])  # not held back until the task's end
            assert task.wait(timeout=120) == 75, (tmp_path / "task.log").read_text()
        finally:
            kill_group(task)
    text = (tmp_path / "task.log").read_text()
    assert "Fork server (pid" in text
    assert "Crawl exit statuses: [-9, 0]" in text, text
    assert text.count("Shipped t0_p0:") == 1, text  # once, not again at the end
    log = (tmp_path / "data" / "logs" / "t0_p1.log").read_text()
    assert "Spider closed (finished)" in log, log


def test_a_task_whose_imports_start_a_thread_starts_plain_crawls(tmp_path):
    """Forking a process that runs threads is unsafe: an extension that starts one when
    imported makes the server refuse, and the task crawls with plain processes."""
    (tmp_path / "threadext.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
        "class ThreadExtension:\n"
        "    @classmethod\n"
        "    def from_crawler(cls, crawler):\n"
        "        return cls()\n"
    )
    (tmp_path / "threadsettings.py").write_text(
        "from crawler.settings import *  # noqa\n"
        "EXTENSIONS = {**EXTENSIONS, 'threadext.ThreadExtension': 900}\n"
    )
    env = {"SCRAPY_SETTINGS_MODULE": "threadsettings",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}  # fmt: skip
    with HostServers(["a.test", "b.test"], latency=0.01) as hosts:
        task = run_task(tmp_path, hosts, per_host=3, env=env)
        try:
            assert task.wait(timeout=120) == 0, (tmp_path / "task.log").read_text()
        finally:
            kill_group(task)
        fetched = sum(server.hits() for server in hosts)
    text = (tmp_path / "task.log").read_text()
    assert "No fork server (the imports started threads" in text, text
    assert "crawls start as plain processes" in text
    assert "Crawl exit statuses: [0, 0]" in text, text
    assert fetched == 6
