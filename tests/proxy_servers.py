"""Real forward proxies (tinyproxy) and a counting origin server on 127.0.0.1.

Import the fixtures into a test module: ``from tests.proxy_servers import origin, proxy_pool``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.servers import free_port, need

PROXY_USER = "alice"
PROXY_PASSWORD = "pr0xy-s3cret-9f2c"


@dataclass
class Hit:
    path: str
    via: str
    proxy_authorization: bool


class Origin:
    """An HTTP server that serves /page/N (and /slow/SECONDS/N, after SECONDS) and records
    every request with its Via header."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with origin._lock:
                    origin.hits.append(
                        Hit(
                            self.path,
                            self.headers.get("Via", ""),
                            "Proxy-Authorization" in self.headers,
                        )
                    )
                if self.path.startswith("/slow/"):
                    # /slow/SECONDS/...: answers after SECONDS, a page slower than a
                    # crawl's DOWNLOAD_TIMEOUT (the client has gone by then).
                    time.sleep(float(self.path.split("/")[2]))
                if self.path.startswith(("/page/", "/slow/")):
                    body = f"<html><body><p>{self.path}</p></body></html>".encode()
                    self.send_response(200)
                else:
                    body = b"not found"
                    self.send_response(404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.end_headers()  # a slow page's client may have gone
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.hits.clear()

    def snapshot(self) -> list[Hit]:
        with self._lock:
            return list(self.hits)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class TinyProxy:
    """One tinyproxy process; ``name`` is its Via header, so the origin sees who forwarded."""

    name: str
    directory: Path
    auth: tuple[str, str] | None = None
    deny_all: bool = False
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        creds = f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""
        return f"http://{creds}127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.log"

    def config(self) -> str:
        lines = [f"Port {self.port}", "Listen 127.0.0.1", "Timeout 60", "MaxClients 100"]
        lines += [f'LogFile "{self.log_path}"', "LogLevel Connect", f'ViaProxyName "{self.name}"']
        if os.geteuid() == 0:
            lines += ["User root", "Group root"]
        if self.auth:
            lines.append(f"BasicAuth {self.auth[0]} {self.auth[1]}")
        if self.deny_all:
            # Clients from 127.0.0.1 are not allowed: every request gets 403.
            lines.append("Allow 192.0.2.1")
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        for _ in range(5):
            self.port = free_port()
            conf = self.directory / f"{self.name}.conf"
            conf.write_text(self.config())
            self.process = subprocess.Popen(
                ["tinyproxy", "-d", "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_listening():
                return
            self.stop()
        raise RuntimeError(f"tinyproxy {self.name} did not start (see {self.log_path})")

    def _wait_listening(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.1)
        return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def requests_logged(self) -> list[str]:
        """The request lines tinyproxy logged (one per request it was sent)."""
        return [line for line in self.log_text().splitlines() if "Request (file descriptor" in line]

    def mark(self) -> None:
        """Remember the log's length: requests_since_mark() then counts only later ones."""
        self._mark = len(self.log_text().splitlines())

    def requests_since_mark(self) -> list[str]:
        """Request lines logged since mark() (a refused client logs a connection only)."""
        return self._since_mark("Request (file descriptor")

    def connections_since_mark(self) -> list[str]:
        return self._since_mark("Connect (file descriptor")

    def _since_mark(self, marker: str) -> list[str]:
        lines = self.log_text().splitlines()[getattr(self, "_mark", 0) :]
        return [line for line in lines if marker in line]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@dataclass
class ProxyPool:
    """Three tinyproxies: ``open``, ``auth`` (basic auth) and ``deny`` (403 to everyone)."""

    proxies: dict[str, TinyProxy]

    def __getitem__(self, name: str) -> TinyProxy:
        return self.proxies[name]

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies.values()]

    def by_port(self, port: int) -> TinyProxy:
        return next(p for p in self.proxies.values() if p.port == port)

    def mark(self) -> None:
        for proxy in self.proxies.values():
            proxy.mark()


def start_pool(directory: Path, extra_open: int = 0) -> ProxyPool:
    """Start the pool; skip (or fail on CI) where tinyproxy is not installed."""
    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    specs = [
        TinyProxy("proxy-open", directory),
        TinyProxy("proxy-auth", directory, auth=(PROXY_USER, PROXY_PASSWORD)),
        TinyProxy("proxy-deny", directory, deny_all=True),
    ]
    specs += [TinyProxy(f"proxy-extra{i}", directory) for i in range(extra_open)]
    pool = ProxyPool({p.name: p for p in specs})
    try:
        for proxy in specs:
            proxy.start()
    except Exception:
        stop_pool(pool)
        raise
    return pool


def stop_pool(pool: ProxyPool) -> None:
    for proxy in pool.proxies.values():
        proxy.stop()


@pytest.fixture(scope="session")
def origin():
    server = Origin()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def proxy_pool(tmp_path_factory):
    pool = start_pool(tmp_path_factory.mktemp("tinyproxy"))
    yield pool
    stop_pool(pool)
