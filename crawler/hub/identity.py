"""Who holds a lease: host, process id, and the Slurm job/task it runs for."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Holder:
    """A lease holder, written into the hub so that people can tell who holds what."""

    host: str
    pid: int
    task: str = ""
    # The crawl it runs for, the same in a rerun (the node and the data directory):
    # a rest of a proxy that crawl caused is not waited out by its rerun.
    crawl: str = ""

    @classmethod
    def current(cls, environ: Mapping[str, str] | None = None) -> Holder:
        env = os.environ if environ is None else environ
        return cls(socket.gethostname(), os.getpid(), task_identity(env))

    def __str__(self) -> str:
        base = f"{self.host}/{self.pid}"
        return f"{base}/{self.task}" if self.task else base


def task_identity(env: Mapping[str, str]) -> str:
    """Job/task id: HUB_HOLDER, else a SLURM array job_task, else a SLURM job id."""
    if env.get("HUB_HOLDER"):
        return env["HUB_HOLDER"]
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID", "")
