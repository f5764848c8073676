"""Where metrics go: TensorBoard event files, a JSON-lines file, and a progress bar.

Only process 0 writes; the others get disabled writers so the loop needs no branches.
TensorBoard event files are written by `EventFile`, here: scalars need only a few fields of
TensorBoard's format, and tensorboardX, which wrote them before, also imports torch and boto3
where they are installed, which made the commands slow to start.

A work directory on gs:// cannot be appended to (an object is written whole) and each
upload takes a network round trip, which a training step must not wait for. So the writer
keeps metrics.jsonl and the event files in a local cache directory (a fresh temporary
directory, removed at close; a few kilobytes per thousand logged steps) and a background
thread uploads every file that changed, whole, at most once every `upload_every_seconds`;
`close` (the end of a run, or its stop for preemption) uploads the final state and waits
for it. A resumed run first downloads the existing metrics.jsonl and appends to it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Mapping

import tqdm

from bertjax.storage import fs

logger = logging.getLogger(__name__)

# How often, at most, the cached metrics of a gs:// run are uploaded while it trains. GCS
# allows about one update per second of one object; the upload is off the training thread.
UPLOAD_EVERY_SECONDS = 15.0


class MetricWriter:
    """Appends {"step": N, metric: value, ...} lines to a JSON-lines file and TensorBoard."""

    def __init__(
        self,
        jsonl_path: str | os.PathLike,
        tensorboard_dir: str | os.PathLike,
        enabled=True,
        *,
        upload_every_seconds: float | None = None,  # default: UPLOAD_EVERY_SECONDS
    ):
        self.enabled = enabled
        self._mirror: _Mirror | None = None
        if not enabled:
            return
        jsonl_path, tensorboard_dir = fs.path(jsonl_path), fs.path(tensorboard_dir)
        if fs.is_remote(jsonl_path) or fs.is_remote(tensorboard_dir):
            interval = upload_every_seconds or UPLOAD_EVERY_SECONDS
            self._mirror = _Mirror(jsonl_path, tensorboard_dir, interval)
            jsonl_path, tensorboard_dir = self._mirror.local_jsonl, self._mirror.local_tensorboard
        self._jsonl = jsonl_path.open("a", encoding="utf-8")
        self._tensorboard = EventFile(tensorboard_dir)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled or not metrics:
            return
        self._jsonl.write(
            json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n"
        )
        self._jsonl.flush()
        for key, value in metrics.items():
            self._tensorboard.add_scalar(key, float(value), step)
        if self._mirror is not None:
            self._mirror.changed()

    def close(self) -> None:
        """Closes the files; on gs://, uploads their final state (raises if that fails)."""
        if self.enabled:
            self.enabled = False
            self._jsonl.close()
            self._tensorboard.close()
            if self._mirror is not None:
                self._mirror.close()


class EventFile:
    """A TensorBoard event file of scalars, `events.out.tfevents.<seconds>.<host>` in a
    directory: TFRecord-framed `Event` protocol buffers (tensorboard's event.proto and
    summary.proto, proto3), the same bytes tensorboardX writes for `add_scalar`. Each event is
    flushed as it is written."""

    def __init__(self, directory: str | os.PathLike, *, wall_time: float | None = None):
        wall_time = time.time() if wall_time is None else wall_time
        directory = fs.path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"events.out.tfevents.{str(wall_time)[:10]}.{socket.gethostname()}"
        self._file = self.path.open("ab")
        self._write(_double(1, wall_time) + _bytes(3, b"brain.Event:2"))  # file_version

    def add_scalar(
        self, tag: str, value: float, step: int, *, wall_time: float | None = None
    ) -> None:
        wall_time = time.time() if wall_time is None else wall_time
        # Summary.Value{tag = 1, simple_value = 2}; a oneof member, so written even when 0.
        summary_value = _bytes(1, tag.encode()) + _key(2, 5) + _float32(value)
        step_field = _key(2, 0) + _varint(step) if step else b""  # proto3 omits a zero
        self._write(_double(1, wall_time) + step_field + _bytes(5, _bytes(1, summary_value)))

    def _write(self, event: bytes) -> None:
        """One TFRecord: length, its masked CRC-32C, the data, the data's masked CRC-32C."""
        length = struct.pack("<Q", len(event))
        record = length + struct.pack("<I", _masked_crc(length))
        self._file.write(record + event + struct.pack("<I", _masked_crc(event)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# Protocol-buffer wire format: a key is (field number << 3) | wire type.
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: a negative number as its two's complement, in ten bytes
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _double(field: int, value: float) -> bytes:
    return _key(field, 1) + struct.pack("<d", value)


def _float32(value: float) -> bytes:
    """As protobuf stores a float field: rounded to float32, beyond its range an infinity."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _bytes(field: int, value: bytes) -> bytes:
    return _key(field, 2) + _varint(len(value)) + value


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of data."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class _Mirror:
    """A local cache of a remote run's metrics files, uploaded by a background thread."""

    def __init__(self, jsonl: fs.AnyPath, tensorboard: fs.AnyPath, upload_every_seconds: float):
        self._cache = tempfile.mkdtemp(prefix="bertjax-metrics-")
        self.local_jsonl = fs.path(os.path.join(self._cache, "metrics.jsonl"))
        self.local_tensorboard = fs.path(os.path.join(self._cache, "tensorboard"))
        self.local_tensorboard.mkdir()
        try:
            # A resumed run appends to what the earlier runs logged.
            self.local_jsonl.write_bytes(fs.read_bytes(jsonl))
        except FileNotFoundError:
            pass
        self._targets = (jsonl, tensorboard)
        self._interval = upload_every_seconds
        self._uploaded: dict[str, tuple[int, int]] = {}  # local file -> (size, mtime) sent
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="bertjax-metrics-upload", daemon=True
        )
        self._thread.start()

    def changed(self) -> None:
        self._changed.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._changed.wait()
            if self._stop.is_set():
                return
            self._changed.clear()
            try:
                self._upload(partial=True)
            except Exception as e:  # noqa: BLE001 - retried at the next change and at close
                # The thread goes on (a training step never waits for it) and says why.
                self._changed.set()
                logger.warning(
                    "could not upload metrics, trying again later: %s", " ".join(str(e).split())
                )
            self._stop.wait(self._interval)  # at most one upload per interval

    def _files(self) -> list[tuple[str, fs.AnyPath]]:
        jsonl, tensorboard = self._targets
        files = [(os.fspath(self.local_jsonl), jsonl)] if self.local_jsonl.exists() else []
        for root, _, names in os.walk(self.local_tensorboard):
            for name in sorted(names):
                local = os.path.join(root, name)
                relative = os.path.relpath(local, self.local_tensorboard)
                files.append((local, tensorboard / relative))
        return files

    def _upload(self, *, partial: bool) -> None:
        for local, remote in self._files():
            stat = os.stat(local)
            if self._uploaded.get(local) == (stat.st_size, stat.st_mtime_ns):
                continue
            with open(local, "rb") as f:
                data = f.read()
            if partial and local == os.fspath(self.local_jsonl):
                data = data[: data.rfind(b"\n") + 1]  # whole lines only while it is written
            fs.write_bytes(remote, data)
            self._uploaded[local] = (stat.st_size, stat.st_mtime_ns)

    def close(self) -> None:
        """Uploads the final state; if that fails, says so in one line and keeps the cache."""
        self._stop.set()
        self._changed.set()
        self._thread.join()
        try:
            self._upload(partial=False)
        except Exception as e:
            raise fs.StorageError(
                f"{' '.join(str(e).split())}; the metrics are kept in {self._cache}"
            ) from e
        shutil.rmtree(self._cache, ignore_errors=True)


class Progress:
    """A progress bar showing step, loss and sequences/s."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True):
        self._bar = tqdm.tqdm(
            total=total, initial=initial, unit="step", dynamic_ncols=True, disable=not enabled
        )
        self._last = initial

    def update(self, step: int) -> None:
        self._bar.update(step - self._last)
        self._last = step

    def show(self, metrics: Mapping[str, float]) -> None:
        shown = {
            "loss": metrics.get("train/loss"),
            "mlm_acc": metrics.get("train/mlm_accuracy"),
            "seq/s": metrics.get("perf/sequences_per_sec"),
            "eval_mlm_acc": metrics.get("eval/mlm_accuracy"),
            "eval_nsp_acc": metrics.get("eval/nsp_accuracy"),
        }
        postfix = {k: f"{v:.4g}" for k, v in shown.items() if v is not None}
        if postfix:
            self._bar.set_postfix(postfix, refresh=True)

    def close(self) -> None:
        self._bar.close()
