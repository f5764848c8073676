"""A fault-injecting HTTP proxy for the GCS emulator: the network between a run and its bucket.

`FaultProxy(upstream)` listens on 127.0.0.1 and forwards each request to the emulator, except
that a seeded share of them (`fault_rate`) is answered 503 or 429 without reaching it, or has
its connection dropped: before the request is forwarded, or after (the store did the work
and the answer is lost, the case that makes a retried conditional write fail its own
precondition). Two kinds of request never lose their answer that way: a resumable upload's
session, which GCS answers again with the finished object but the emulator with 404, and a
batch of deletes, which gcsfs, sent again after its objects are gone, reads as "nothing
deleted" (FileNotFoundError). `outage(seconds)` drops every request for that long. Clients
reach it through the endpoints the emulator fixture sets (STORAGE_EMULATOR_HOST for gcsfs,
TENSORSTORE_GCS_HTTP_URL for tensorstore): `env` holds them.

Bounded: every forwarded request times out, and the proxy stops itself after `lifetime`
seconds if its owner never calls `stop`. Stopping also closes the connections the clients keep
open: each holds a thread of this process until the client hangs up, which a pooled client
does not do while the process lives.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import random
import socket
import struct
import threading
import time
import urllib.parse

# Headers that belong to one connection, not to the message: never forwarded.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
}
# The faults, in the order of their shares of `fault_rate`.
FAULTS = ("503", "429", "drop", "drop_after")


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        *,
        fault_rate: float = 0.0,
        seed: int = 0,
        lifetime: float = 1800.0,
        timeout: float = 120.0,
    ):
        target = urllib.parse.urlsplit(upstream)
        self.upstream = (target.hostname, target.port)
        self.fault_rate = fault_rate
        self.timeout = timeout
        self.counts: collections.Counter[str] = collections.Counter()
        self.requests: collections.deque[str] = collections.deque(maxlen=10000)  # "GET /path"
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._down_client: str | None = None
        self._script: collections.deque[str] = collections.deque()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.env = {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url}
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def outage(self, seconds: float, client: str | None = None) -> None:
        """Drops every request (or only those of `client`: "tensorstore", "python-gcsfs")
        from now on for `seconds`."""
        with self._lock:
            self._down_until = time.monotonic() + seconds
            self._down_client = client

    def script(self, *faults: str | None) -> None:
        """The faults of the next requests, in order (None: forward that one)."""
        with self._lock:
            self._script.extend(faults)

    def clear_script(self) -> None:
        """Forgets the scripted faults not yet used: how many requests a client's retries take
        varies, so a script may outlast the calls it was meant for."""
        with self._lock:
            self._script.clear()

    def decide(self, request: str, client: str) -> str | None:
        """This request's fault ("outage", one of FAULTS), or None to forward it."""
        with self._lock:
            self.counts["requests"] += 1
            self.counts[client] += 1
            self.requests.append(request)
            if time.monotonic() < self._down_until and self._down_client in (None, client):
                fault = "outage"
            elif self._script:
                fault = self._script.popleft()
                if fault is None:
                    return None
            elif self._rng.random() < self.fault_rate:
                fault = self._rng.choice(FAULTS)
                if fault == "drop_after" and ("upload_id=" in request or "/batch/" in request):
                    fault = "drop"
            else:
                return None
            self.counts[fault] += 1
            self.counts[f"{fault}:{client}"] += 1
            return fault

    def stop(self) -> None:
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()


class _Server(http.server.ThreadingHTTPServer):
    """Keeps the connections it serves, to close them when the proxy stops."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Ends every open connection: its thread, waiting for the next request, reads the
        end of the stream and returns."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up (it gave up, or a fault closed the connection): routine


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients use it

    def do_GET(self):
        self._serve()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    def log_message(self, *args) -> None:  # one line per request would drown the test output
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _drop(self) -> None:
        """Closes the connection at once with a reset, as a failing network does."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _answer(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self) -> None:
        proxy: FaultProxy = self.server.proxy
        body = self._body()
        # The client by its User-Agent's first word: python-gcsfs/..., tensorstore/...
        client = self.headers.get("User-Agent", "?").split("/")[0].split()[0]
        fault = proxy.decide(f"{self.command} {self.path}", client)
        if fault in ("outage", "drop"):
            return self._drop()
        if fault in ("503", "429"):
            error = {"error": {"code": int(fault), "message": "injected fault"}}
            data = json.dumps(error).encode()
            return self._answer(int(fault), data, [("Content-Type", "application/json")])
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=proxy.timeout)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        if fault == "drop_after":
            return self._drop()
        self._answer(response.status, data, response.getheaders())
