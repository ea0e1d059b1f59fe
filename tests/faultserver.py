"""A raw-socket HTTP server for answers no well-behaved server sends: a gzip body cut
short by a closed connection, an endless body, a gzip bomb."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
from collections import Counter

TRUNCATED_PAGE = (b"<html><body>" + b"".join(b"<p>line %d</p>" % n for n in range(5000)))[:70_800]
CHUNK = b"x" * 65_536


class RawServer:
    """Answers ``GET /truncated``, ``/endless``, ``/bomb`` and anything else with a
    small complete page; counts the requests per path."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.counts: Counter = Counter()
        self.sent: Counter = Counter()  # body bytes sent per path
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            path = data.split(b" ", 2)[1].decode()
            with self._lock:
                self.counts[path] += 1
            # OSError: the client gave up (what an endless body is for).
            with contextlib.suppress(OSError):
                self._send(conn, path)

    def _send(self, conn: socket.socket, path: str) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
        if path == "/truncated":
            body = gzip.compress(TRUNCATED_PAGE)
            # No Content-Length: the closed connection is the end of the body.
            conn.sendall(head + b"Content-Encoding: gzip\r\n\r\n" + body[: len(body) // 2])
        elif path == "/endless":
            conn.sendall(head + b"\r\n")
            while True:
                conn.sendall(CHUNK)
                with self._lock:
                    self.sent[path] += len(CHUNK)
        elif path == "/bomb":
            body = gzip.compress(b"\0" * (200 << 20), compresslevel=9)
            conn.sendall(
                head
                + b"Content-Encoding: gzip\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
        else:
            body = b"<html><body>fine</body></html>"
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def close(self) -> None:
        self.sock.close()
