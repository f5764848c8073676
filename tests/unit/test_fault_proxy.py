"""The GCS fault proxy of the tests (tests/helpers/fault_proxy.py) leaves no thread behind: a
kept-alive connection holds a thread of the test process until the client hangs up, and the
library's pooled clients do not while the process lives."""

import socket
import threading
import time

from tests.helpers.fault_proxy import FaultProxy


def _connection_threads() -> set[threading.Thread]:
    """The threads socketserver starts, one per connection."""
    return {t for t in threading.enumerate() if t.name.endswith("(process_request_thread)")}


def test_stopping_the_proxy_ends_the_threads_of_the_connections_left_open():
    before = _connection_threads()
    proxy = FaultProxy("http://127.0.0.1:9")  # no request is forwarded
    port = int(proxy.url.rsplit(":", 1)[1])
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    deadline = time.monotonic() + 10
    while len(_connection_threads() - before) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    serving = _connection_threads() - before
    assert len(serving) == 3
    proxy.stop()
    for thread in serving:
        thread.join(timeout=10)
    assert not [t for t in serving if t.is_alive()], "threads left after stop"
    for client in clients:
        assert client.recv(1) == b""  # the proxy hung up
        client.close()
