"""A PostgreSQL cluster of a test's own, on a free port, that the test may stop and start.

The machine's main server (port 5432) is shared by every test run and is never restarted;
a test that takes the hub away starts this second cluster instead (``initdb`` and
``pg_ctl`` of Debian's PostgreSQL 15, run as the ``postgres`` user).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.servers import free_port, need

BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


class PgCluster:
    """A throw-away cluster: ``start()``, ``stop()``, ``start()`` again, ``destroy()``."""

    def __init__(self) -> None:
        if not (BIN / "initdb").exists() or not (BIN / "pg_ctl").exists():
            need(f"no initdb/pg_ctl in {BIN} (Debian: apt-get install postgresql-15)")
        try:
            self._user = pwd.getpwnam("postgres")
        except KeyError:
            need("no postgres user to run a second PostgreSQL cluster as")
        if os.geteuid() != 0:
            need("running a second PostgreSQL cluster as the postgres user needs root")
        self.root = Path(tempfile.mkdtemp(prefix="hub-pg-"))
        os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._as_postgres(
            BIN / "initdb", "-A", "trust", "-U", "postgres", "--no-sync", "-D", self.data
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def postmaster_pid(self) -> int:
        """The server's main process (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def _as_postgres(self, *args: object) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *map(str, args)],
            check=True,
            capture_output=True,
            timeout=180,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c fsync=off -c max_connections=100"
        )
        self._as_postgres(
            BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "-t", "120",
            "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._as_postgres(BIN / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                ["runuser", "-u", "postgres", "--", str(BIN / "pg_ctl"), "-D", str(self.data),
                 "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=120,
            )  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)
