"""Checkpoint integrity: an exact fingerprint of every array leaf, recorded at save and checked
at restore.

Integrity: storage can return different bytes than were written without any error (a
garbled block decodes to other, often finite, numbers). So every save records an exact
fingerprint of each array leaf, computed from the values being saved (on the devices; small
leaves by numpy on the host, bit for bit the same), and every restore recomputes it from the
values read and checks them for NaN/inf too. A step that fails is treated like an unreadable
one: named, skipped and, when resuming, moved to corrupt/.
The fingerprint is a sum modulo 2**32 of a hash of each element's bits and its position in
the global array; integer addition is exact and order-free, so it does not depend on how the
array is sharded: each process only reads its own shards, the reduction makes one replicated
number, and a restore onto another mesh (or one device) checks against the same value.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

logger = logging.getLogger(__name__)

# The key of the meta item that holds the integrity record; reserved, stripped on restore.
INTEGRITY_KEY = "integrity"
# Names the fingerprint function below; a record with another name is not compared.
FINGERPRINT_ALGORITHM = "bertjax-mix32-sum-v1"


class CheckpointIntegrityError(ValueError):
    """A step read back without error whose values differ from those saved, or are not finite."""


def _mix32(x):
    """MurmurHash3's 32-bit finaliser: a cheap bijection that spreads every input bit. Of a
    uint32 jax or numpy array alike (numpy's products wrap modulo 2**32 as XLA's do)."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


_UNSIGNED_OF_BITS = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}


def _bit_width(dtype) -> int | None:
    """Bits per element, or None for dtypes the fingerprint does not cover (complex, keys)."""
    if dtype == jnp.bool_:
        return 8
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.finfo(dtype).bits
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).bits
    return None


def _fingerprintable(leaf: Any) -> bool:
    return (
        isinstance(leaf, (jax.Array, np.ndarray))
        and _bit_width(leaf.dtype) in (8, 16, 32, 64)
        and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended)
    )


def _words(x: jax.Array) -> jax.Array:
    """Each element's bits as one uint32, same shape as x (64-bit elements folded)."""
    bits = _bit_width(x.dtype)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if bits == 64:
        halves = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [*x.shape, 2]
        return halves[..., 0] ^ _mix32(halves[..., 1])
    return jax.lax.bitcast_convert_type(x, _UNSIGNED_OF_BITS[bits]).astype(jnp.uint32)


def _fingerprint(x: jax.Array) -> jax.Array:
    """sum(mix(bits ^ mix(flat index))) mod 2**32: exact, order-free, position-sensitive."""
    index = jnp.zeros(x.shape, jnp.uint32)  # the element's flat position in the global array
    stride = 1
    for axis in reversed(range(x.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(
            stride % 2**32
        )
        stride *= x.shape[axis]
    salt = _mix32(index + jnp.uint32(0x9E3779B9))
    return jnp.sum(_mix32(_words(x) ^ salt), dtype=jnp.uint32)  # wraps: exact in any order


def _leaf_summary(x: jax.Array) -> jax.Array:
    """[fingerprint, finite] of one leaf, as uint32."""
    finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else True
    return jnp.stack([_fingerprint(x), jnp.asarray(finite, jnp.uint32)])  # [2]


# Compiled once per distinct shape, dtype and sharding (14 for BERT-small, whatever the number
# of layers): one program over every leaf compiled slower (benchmarks/checkpoint.py).
_leaf_summary_jit = jax.jit(_leaf_summary)

# Leaves of at most this many elements (of 8, 16 or 32 bits, on this process's devices) are
# summarised by numpy on the host instead, bit for bit the same: a leaf of a new shape costs a
# compiled program on the devices (about 0.1 s on a CPU, more on an accelerator), and a
# model's small leaves (biases, norms' scales, small projections) come in many shapes, while
# numpy summarises this many elements in about half a millisecond. Larger leaves are
# read in place on their devices, faster than the host would (benchmarks/checkpoint.py).
HOST_ELEMENTS = 65_536


def _on_host(leaf: Any) -> bool:
    if _bit_width(leaf.dtype) == 64 or leaf.size > HOST_ELEMENTS:
        return False
    return isinstance(leaf, np.ndarray) or leaf.is_fully_addressable or leaf.is_fully_replicated


def _host_summary(x: np.ndarray) -> tuple[int, bool]:
    """_leaf_summary of a leaf of 8, 16 or 32 bits, by numpy: (fingerprint, finite)."""
    flat = np.ascontiguousarray(x).reshape(-1)  # row-major: the flat position _fingerprint uses
    if flat.dtype == np.bool_:
        words = flat.astype(np.uint32)
    else:
        words = flat.view(np.dtype(_UNSIGNED_OF_BITS[_bit_width(flat.dtype)])).astype(np.uint32)
    salt = _mix32(np.arange(flat.size, dtype=np.uint32) + np.uint32(0x9E3779B9))
    fingerprint = int(_mix32(words ^ salt).sum(dtype=np.uint64) % 2**32)
    finite = bool(np.isfinite(flat).all()) if jnp.issubdtype(flat.dtype, jnp.inexact) else True
    return fingerprint, finite


def _to_host(x: jax.Array) -> np.ndarray:
    if not (x.is_fully_replicated or x.is_fully_addressable):  # multi-process
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


class LeafSummary(NamedTuple):
    """What save records and restore checks for one array leaf."""

    item: str  # the checkpoint item (parameters or optimizer state)
    path: str  # jax.tree_util.keystr of the leaf within its item
    dtype: str
    shape: tuple[int, ...]
    fingerprint: int
    finite: bool

    @property
    def name(self) -> str:
        return f"{self.item}{self.path}"


def summarise(trees: dict[str, Any]) -> list[LeafSummary]:
    """Fingerprint and finiteness of every array leaf of {item name: pytree}.

    Reads each leaf once on its devices and brings two numbers per leaf to the host (a leaf
    of at most HOST_ELEMENTS elements is brought whole and summarised there); works on
    sharded arrays across processes. It costs a fraction of the save itself, plus compiling
    on a run's first save (benchmarks/checkpoint.py measures both). Integer reductions are
    slow on XLA's CPU backend; on an accelerator it is one read of the state.
    """
    entries = [
        (item, jax.tree_util.keystr(path), leaf)
        for item, tree in trees.items()
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if _fingerprintable(leaf)
    ]
    # One leaf at a time, each fetched before the next is dispatched, once the state itself
    # is computed: at most one of these cross-device reductions is in flight, never queued
    # beside a train step. Dispatching every leaf's program at once (235 for BERT-small)
    # behind an unfinished train step aborted runs on 8 simulated CPU devices under load: an
    # all-reduce rendezvous timed out with some devices still busy with other programs.
    jax.block_until_ready([leaf for _, _, leaf in entries])
    fingerprints, finite = [], []
    for _, _, leaf in entries:
        if _on_host(leaf):
            fingerprint, ok = _host_summary(np.asarray(leaf))
        else:
            fingerprint, ok = _to_host(_leaf_summary_jit(leaf))
        fingerprints.append(int(fingerprint))
        finite.append(bool(ok))
    return [
        LeafSummary(item, path, str(leaf.dtype), tuple(leaf.shape), fp, ok)
        for (item, path, leaf), fp, ok in zip(entries, fingerprints, finite)
    ]


def first_few(names: list[str], limit: int = 5) -> str:
    extra = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + extra


def record(summaries: list[LeafSummary]) -> dict:
    leaves: dict[str, dict[str, list]] = {}
    for s in summaries:
        leaves.setdefault(s.item, {})[s.path] = [s.fingerprint, s.dtype, list(s.shape)]
    return {"algorithm": FINGERPRINT_ALGORITHM, "leaves": leaves}


def verify(step: int, meta: dict, trees: dict[str, Any]) -> None:
    """Raise CheckpointIntegrityError unless the restored trees match what step's save recorded.

    Every float leaf must be finite. Leaves with a recorded fingerprint must reproduce it,
    except where the restore target asked for another dtype or shape (then the bits differ by
    design). Checkpoints saved before fingerprints were recorded get the finiteness check only.
    """
    summaries = summarise(trees)
    problems = [f"{s.name} holds NaN or inf" for s in summaries if not s.finite]
    damaged = {s.name for s in summaries if not s.finite}
    record = meta.get(INTEGRITY_KEY)
    if not isinstance(record, dict) or record.get("algorithm") != FINGERPRINT_ALGORITHM:
        logger.info(
            "checkpoint step %d has no integrity record this version can read; "
            "checked its values for NaN/inf only",
            step,
        )
    else:
        saved = record.get("leaves", {})
        for s in summaries:
            entry = saved.get(s.item, {}).get(s.path)
            if entry is None or entry[1] != s.dtype or tuple(entry[2]) != s.shape:
                continue
            if s.name in damaged:
                continue
            if entry[0] != s.fingerprint:
                problems.append(f"{s.name} differs from what was saved (fingerprint mismatch)")
    if problems:
        raise CheckpointIntegrityError(f"checkpoint step {step} is damaged: {first_few(problems)}")


def public_meta(meta: Any) -> dict:
    """The caller's meta dict, without the integrity record."""
    return {k: v for k, v in dict(meta).items() if k != INTEGRITY_KEY}
