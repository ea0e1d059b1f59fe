"""An HTTP server that answers each path with exact bytes, for byte-level test cases.

Answers are whole HTTP responses (status line, headers, body) written to the socket
as given, so a test controls every byte: non-ASCII header values, garbage gzip,
redirect loops. Requests are counted per path.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Callable

Answer = bytes | Callable[[str], bytes]


def response(
    status: str = "200 OK", headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b""
) -> bytes:
    """A whole HTTP/1.1 response with a Content-Length and ``Connection: close``."""
    lines = [b"HTTP/1.1 " + status.encode()]
    lines += [name + b": " + value for name, value in headers or []]
    lines += [b"Content-Length: %d" % len(body), b"Connection: close", b"", b""]
    return b"\r\n".join(lines) + body


class RawServer:
    """Serves ``answers[path]`` (bytes, or a function of the path) on 127.0.0.1 or ::1."""

    def __init__(self, answers: dict[str, Answer], host: str = "127.0.0.1"):
        self.answers = answers
        self.counts: Counter[str] = Counter()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        netloc = f"[{host}]" if family == socket.AF_INET6 else host
        self.base_url = f"http://{netloc}:{self.port}"
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str) -> str:
        return self.base_url + path

    def close(self) -> None:
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            path = data.split(b" ", 2)[1].decode("latin-1")
            with self._lock:
                self.counts[path] += 1
            answer = self.answers.get(path.split("?")[0])
            if answer is None:
                answer = response("404 Not Found", body=b"not found")
            elif callable(answer):
                answer = answer(path)
            with contextlib.suppress(OSError):
                conn.sendall(answer)
