"""A real single-node Slurm cluster for the tests (munge + slurmctld + slurmd).

``slurm_cluster`` (session fixture) installs Debian's packages when they are missing
(root and apt-get needed), writes a slurm.conf in a temporary directory (ports the OS
picks, no cgroups, fast scheduling and requeues), starts the daemons, waits for an idle
node and stops its daemons at the end (munged, the machine's, stays running). One
cluster serves every Slurm test of a test process. Where any of that cannot be done,
the tests are skipped with the reason (failed where REQUIRE_SERVERS=1, as on CI).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from tests.polling import WaitError, wait_until
from tests.servers import free_port, need

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
POLICY_RC = Path("/usr/sbin/policy-rc.d")


def _run(cmd: list[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def install() -> None:
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        need(
            "Slurm is not installed and cannot be (needs root and apt-get): "
            f"apt-get install {' '.join(PACKAGES)}"
        )
    if not POLICY_RC.exists():
        # Package scripts must not start the services: the fixture starts its own.
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
           "-o", "DPkg::Lock::Timeout=600", *PACKAGES]  # fmt: skip
    done = _run(cmd, timeout=900, env=env)
    if done.returncode != 0:
        _run(["apt-get", "update", "-qq"], timeout=600, env=env)
        done = _run(cmd, timeout=900, env=env)
    if done.returncode != 0:
        need(f"cannot install Slurm ({' '.join(PACKAGES)}): {done.stderr.strip()[-500:]}")


def _wait(check, timeout: float, what: str, step: float = 0.3) -> None:
    """Wait for a part of the test cluster; one that does not come up skips the tests."""
    try:
        wait_until(check, what, timeout, step=step)
    except WaitError:
        need(f"Slurm test cluster: {what} not ready within {timeout:.0f} s")


def _munge_ok() -> bool:
    try:
        enc = _run(["munge", "-n"], timeout=10)
        return (
            enc.returncode == 0 and _run(["unmunge"], input=enc.stdout, timeout=10).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _node_line(conf_dir: Path) -> str:
    """This machine's node line (slurmd -C), with memory lowered and a loopback address."""
    out = _run(["slurmd", "-C"]).stdout.splitlines()[0]
    name = re.search(r"NodeName=(\S+)", out).group(1)
    mem = int(re.search(r"RealMemory=(\d+)", out).group(1))
    # config_overrides: more CPUs than cores, so that several 1-CPU tasks run at once.
    return f"NodeName={name} NodeAddr=127.0.0.1 CPUs=8 RealMemory={int(mem * 0.9)} State=UNKNOWN"


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.daemons: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def write_conf(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=testcluster",
            # Job ids no other test cluster on this machine uses: kill_task finds a
            # task's processes by its ids.
            f"FirstJobId={random.SystemRandom().randrange(10**5, 6 * 10**7)}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "AuthInfo=cred_expire=5",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r / 'log' / 'jobcomp.log'}",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MinJobAge=600",
            "KillWait=10",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2",
            _node_line(r),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        if not _munge_ok():
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(int(Path("/run/munge/munged.pid").read_text()), signal.SIGTERM)
            _run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"])
            done = _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
            if done.returncode != 0:
                need(f"cannot start munged: {done.stderr.strip()}")
            _wait(_munge_ok, 20, "munge")
        self.write_conf()
        for daemon in ("slurmctld", "slurmd"):
            args = [daemon, "-D"] + (["-c"] if daemon == "slurmctld" else [])
            with open(self.root / "log" / f"{daemon}.out", "wb") as out:
                self.daemons[daemon] = subprocess.Popen(
                    args, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            if daemon == "slurmctld":
                _wait(lambda: self.run(["scontrol", "ping"]).stdout.count("UP") > 0, 30,
                      "slurmctld")  # fmt: skip
        _wait(self._idle, 60, "the node (sinfo idle)")

    def _idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.strip()
        return out.startswith("idle")

    def run(self, cmd: list[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        return _run(cmd, timeout=timeout, env=kwargs.pop("env", self.env), **kwargs)

    def job_states(self, job: str) -> list[str]:
        """States of a job (of each task of an array) while Slurm keeps it."""
        out = self.run(["scontrol", "-o", "show", "job", job]).stdout
        return re.findall(r"JobState=(\S+)", out)

    def job_field(self, job: str, name: str) -> str | None:
        out = self.run(["scontrol", "-o", "show", "job", job]).stdout
        found = re.search(rf"\b{name}=(\S+)", out)
        return found.group(1) if found else None

    def wait_done(self, job: str, timeout: float = 120) -> list[str]:
        """Wait until no task of ``job`` is pending or running; returns the states."""
        active = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED",
                  "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"}  # fmt: skip

        def finished() -> list[str]:
            states = self.job_states(job)
            return states if states and not active.intersection(states) else []

        return wait_until(finished, f"job {job} done", timeout, step=1)

    def wait_state(self, job: str, state: str, timeout: float = 60) -> None:
        wait_until(lambda: state in self.job_states(job), f"job {job} {state}", timeout, step=0.5)

    def kill_task(self, array: str, task: int = 0) -> int:
        """SIGKILL every process of an array task at once, as a node crash or the OOM
        killer would (``scancel --signal=KILL`` is a cancel: SIGTERM first, SIGKILL only
        KillWait later). Returns the number of processes killed."""
        marks = {f"SLURM_ARRAY_JOB_ID={array}".encode(), f"SLURM_ARRAY_TASK_ID={task}".encode()}
        pids = []
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if proc.name.isdigit() and marks <= set(
                    (proc / "environ").read_bytes().split(b"\0")
                ):
                    pids.append(int(proc.name))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run(["scancel", "--full", "--user", "root"], timeout=20)
            time.sleep(1)
        for daemon in ("slurmd", "slurmctld"):
            proc = self.daemons.get(daemon)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        # munged stays: it is the machine's, and another test cluster on this machine
        # (another worker's, another checkout's) may be using it.


# The cluster of this test process. Each module that imports the fixture holds a copy
# of it, a session fixture of its own: the first to run starts the cluster (and stops
# it at the end), the others use it.
_STARTED: list[SlurmCluster] = []


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if _STARTED:
        yield _STARTED[0]
        return
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        need("Slurm is not installed and this machine has no apt-get")
    install()
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        _STARTED.append(cluster)
        yield cluster
    finally:
        _STARTED.clear()
        cluster.stop()


# -- what the Slurm tests check --------------------------------------------------------


def slow_urls(site, first: int, n: int, ms: int) -> list[str]:
    return [f"{site.base_url}/slow/{k}?ms={ms}" for k in range(first, first + n)]


def fetched(site, urls: list[str]) -> dict[str, int]:
    return {urlsplit(u).path: site.counts[urlsplit(u).path] for u in urls}


def shipped_rows(data: Path) -> dict[str, object]:
    """URL -> row of every shipped catalog; each row must read back from DATA."""
    out = {}
    datadir = DataDir(data)
    for db in datadir.shipped_catalogs():
        with Catalog(db, readonly=True) as catalog:
            for row in catalog.rows():
                stored = datadir.read(row)
                assert len(stored.body) == row.bytes, (db, row)
                out[row.url] = row
    return out


def logs(data: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((data / "logs").glob("*")))
