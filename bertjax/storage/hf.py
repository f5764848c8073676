"""Transformers directories' files, whatever the encoder family: the format-neutral layer.

Reading and writing safetensors (model.safetensors, a sharded model.safetensors.index.json,
or pytorch_model.bin, read with torch only then), config.json, tokenizer files (bertjax's
sentencepiece model, a WordPiece tokenizer.json, or BERT's vocab.txt: `load_tokenizer`),
a directory staged locally and uploaded file by file to `gs://` (each object appears only
once its upload is complete), and the tensor-spec vocabulary each family's tensor map is
written in (`TensorSpec`, the parameter groups) and the one pair of functions that moves
tensors both ways by it (`match_tensors` reads, `tensors_from` writes).

Each family's transformers module (bertjax/encoders/<family>/hf.py) maps its tensors and
config, as bertjax.tasks.seq2seq.hf maps an encoder-decoder's; bertjax.encoders.read_transformers
opens a directory of any family, chosen by config.json's model_type, and each family's
write_transformers writes one.

Safetensors files are read and written with `safetensors.numpy`, so neither torch nor
transformers is needed at run time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.storage import fs

try:
    from safetensors import SafetensorError
    from safetensors import numpy as safetensors_numpy
except ImportError:  # the `hf` extra is not installed; reading and writing say so when called
    safetensors_numpy = None

    class SafetensorError(Exception):
        """Stands in for safetensors' error type, which nothing raises without it."""


logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"
TORCH_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"

# Parameter groups: the encoder core must be in every checkpoint; each other group is
# either complete or entirely absent (then freshly initialised and reported).
CORE = "core"
POOLER = "pooler"
MLM_HEAD = "mlm_head"
NSP_HEAD = "nsp_head"
SINUSOIDAL = "sinusoidal"  # the fixed position table: written as a tensor, never a parameter


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One HF tensor and the bertjax parameter it maps to."""

    hf_name: str  # canonical HF name, with the "bert." prefix
    path: tuple[str, ...]  # key path in the (unstacked) bertjax params tree
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]  # bertjax shape
    transpose: bool  # torch Linear weight: [out, in] vs our [in, ...out]
    group: str

    def to_bertjax(self, array: np.ndarray) -> np.ndarray:
        """Converts the HF tensor to the bertjax layout."""
        if self.transpose:
            array = array.T  # [in, out]
        return np.ascontiguousarray(array.reshape(self.shape))

    def to_hf(self, array: np.ndarray) -> np.ndarray:
        """Converts the bertjax parameter to the HF layout."""
        if self.transpose:
            # Our kernels flatten row-major to [in, out]; HF stores the transpose.
            array = array.reshape(self.hf_shape[::-1]).T  # [out, in]
        # A fresh, writable array: torch.from_numpy warns on the read-only views jax gives.
        return np.array(array.reshape(self.hf_shape), order="C")


def _parameter(flat: Mapping[tuple[str, ...], Any], spec: TensorSpec) -> np.ndarray:
    """The parameter a tensor is made of, as numpy, checked to be there with its shape."""
    name = "/".join(spec.path)
    if spec.path not in flat:
        raise ValueError(f"params: missing parameter {name!r} (shape {spec.shape})")
    array = to_numpy(flat[spec.path])
    if tuple(array.shape) != spec.shape:
        raise ValueError(
            f"params: parameter {name!r} has shape {tuple(array.shape)}, expected {spec.shape}"
        )
    return array


def require_safetensors() -> None:
    if safetensors_numpy is None:
        raise ImportError(
            "reading and writing transformers weights needs the safetensors "
            "package: pip install 'bertjax[hf]'"
        )


def read_weights(directory: fs.AnyPath) -> tuple[dict[str, np.ndarray], str]:
    """Reads every tensor of the directory's weights, in the order transformers prefers."""
    safe = directory / SAFE_WEIGHTS_NAME
    safe_index = directory / SAFE_WEIGHTS_INDEX_NAME
    torch_file = directory / TORCH_WEIGHTS_NAME
    torch_index = directory / TORCH_WEIGHTS_INDEX_NAME
    if safe.is_file():
        require_safetensors()
        return _read_safetensors(safe), str(safe)
    if safe_index.is_file():
        require_safetensors()
        tensors = {}
        for shard in _index_shards(safe_index):
            tensors.update(_read_safetensors(directory / shard))
        return tensors, str(safe_index)
    if torch_file.is_file():
        return _read_torch_file(torch_file), str(torch_file)
    if torch_index.is_file():
        tensors = {}
        for shard in _index_shards(torch_index):
            tensors.update(_read_torch_file(directory / shard))
        return tensors, str(torch_index)
    raise FileNotFoundError(
        f"{directory}: no weights found; expected one of {SAFE_WEIGHTS_NAME}, "
        f"{SAFE_WEIGHTS_INDEX_NAME}, {TORCH_WEIGHTS_NAME}, {TORCH_WEIGHTS_INDEX_NAME}"
    )


def read_config(path: fs.AnyPath) -> dict[str, Any]:
    """config.json as a dict; a file that is not a JSON object is named with what is wrong."""
    try:
        value = json.loads(fs.read_text(path))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: line {err.lineno}: not valid JSON ({err.msg}); expected a transformers "
            "config object"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: holds a JSON {type(value).__name__}; expected a transformers config object"
        )
    return value


def _read_safetensors(path: fs.AnyPath) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file; a damaged file is named with what is wrong."""
    try:
        if fs.is_remote(path):  # read whole: the tensors are all wanted anyway
            return dict(safetensors_numpy.load(fs.read_bytes(path)))
        return dict(safetensors_numpy.load_file(path))
    except fs.StorageError:
        raise
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing (named by the weights index)") from None
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path}: not a readable safetensors file ({reason}); it is truncated or damaged, "
            "export or download it again"
        ) from None


def write_json(path: pathlib.Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


@contextlib.contextmanager
def staged(directory: fs.AnyPath):
    """Yields a temporary sibling of `directory`; once the block completes, moves its files in.

    Each file then replaces its namesake by one rename, after every file was written whole,
    so a failure while writing (a full disk, a bad tensor) leaves the old files untouched;
    other files already in `directory` stay. Subdirectories are merged the same way. Files
    get the umask's permissions, as `open` would give them (safetensors and temporary
    directories are private by default). A failure is reported against `directory`, the
    path the caller gave, never the temporary one.

    For a `gs://` directory the files are made in a local temporary directory and uploaded
    once all are complete (see `upload`): a failure while writing them uploads nothing.
    """
    if fs.is_remote(directory):
        with tempfile.TemporaryDirectory(prefix="bertjax-export-") as staging:
            with _writing(directory):
                yield pathlib.Path(staging)
            upload(staging, directory)
        return
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(
            tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent)
        )
    except OSError as err:
        raise OSError(err.errno, f"cannot write {directory}: {err.strerror}") from None
    try:
        with _writing(directory):
            yield staging
        umask = os.umask(0)
        os.umask(umask)
        _move_into(staging, directory, umask)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _writing(directory: fs.AnyPath):
    """A failure while writing an export's files (a full disk: an OSError from `open`, a
    SafetensorError from safetensors' own writer) as one OSError naming `directory`, the
    path the caller gave, and the cause."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, f"cannot write {directory}: {err.strerror or err}") from None
    except SafetensorError as err:
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OSError(f"cannot write {directory}: {cause}") from None


def _move_into(staging: pathlib.Path, directory: pathlib.Path, umask: int) -> None:
    """Renames each file of `staging` over its namesake in `directory`, subdirectories too."""
    directory.mkdir(exist_ok=True)
    for entry in sorted(staging.iterdir()):
        if entry.is_dir():
            _move_into(entry, directory / entry.name, umask)
            continue
        os.chmod(entry, 0o666 & ~umask)
        os.replace(entry, directory / entry.name)


def upload(local: str | os.PathLike, directory: str | os.PathLike) -> None:
    """Copies a local directory's files (and subdirectories) into `directory` (local or
    gs://), each file written whole; config.json last, so that a reader who finds it finds
    the weights it describes already there."""
    local = pathlib.Path(local)
    files = sorted(
        (f for f in local.rglob("*") if f.is_file()),
        key=lambda f: (f.relative_to(local).as_posix() == CONFIG_NAME, f.relative_to(local).parts),
    )
    fs.makedirs(directory)
    for file in files:
        fs.write_bytes(fs.join(directory, *file.relative_to(local).parts), file.read_bytes())


def _index_shards(index_path: fs.AnyPath) -> list[str]:
    weight_map = json.loads(fs.read_text(index_path)).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index_path}: no 'weight_map' of tensor name -> shard file")
    return sorted(set(weight_map.values()))


def _read_torch_file(file: fs.AnyPath) -> dict[str, np.ndarray]:
    """Reads a torch state dict; torch is optional, so it is imported only here."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        raise ImportError(
            f"{file}: reading {TORCH_WEIGHTS_NAME} needs torch, which is not installed; "
            f"install the extra (pip install 'bertjax[hf]') or convert the checkpoint to "
            f"{SAFE_WEIGHTS_NAME}"
        ) from e
    source = io.BytesIO(fs.read_bytes(file)) if fs.is_remote(file) else file
    state = torch.load(source, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise ValueError(f"{file}: expected a state dict of tensors, got {type(state).__name__}")
    tensors = {}
    for name, tensor in state.items():
        tensor = tensor.detach().contiguous()
        if tensor.dtype == torch.bfloat16:
            # numpy has no native bfloat16: move the bits and view them as ml_dtypes' type.
            tensors[name] = tensor.view(torch.int16).numpy().view(jnp.bfloat16)
        else:
            tensors[name] = tensor.numpy()
    return tensors


def match_tensors(
    specs, found, source, *, required, unwanted, dtype, expected_from: str = ""
) -> tuple[dict[tuple[str, ...], np.ndarray], list[str]]:
    """A transformers file's tensors `found` (by name) matched to a family's tensor specs:
    (bertjax's arrays by path in `dtype`, the groups with no tensor at all, in spec order,
    leaving out `unwanted` ones). A group that is `required`, or partly present, must be
    whole; a tensor of another shape is refused, naming the file (and `expected_from`)."""
    present = {spec.group for spec in specs if spec.hf_name in found}
    flat: dict[tuple[str, ...], np.ndarray] = {}
    missing: list[str] = []
    for spec in specs:
        if spec.hf_name not in found:
            if spec.group in required or spec.group in present:
                raise ValueError(
                    f"{source}: missing tensor {spec.hf_name!r} (shape {spec.hf_shape})"
                )
            if spec.group not in unwanted and spec.group not in missing:
                missing.append(spec.group)
            continue
        array = found[spec.hf_name]
        if tuple(array.shape) != spec.hf_shape:
            raise ValueError(
                f"{source}: tensor {spec.hf_name!r} has shape {tuple(array.shape)}, "
                f"expected {spec.hf_shape}{expected_from}"
            )
        flat[spec.path] = spec.to_bertjax(array).astype(dtype)
    return flat, missing


def tensors_from(
    specs, params: Mapping, *, fixed: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """A family's tensor specs made of bertjax's `params` (a tree, unboxed, plain layout): the
    transformers tensors by name, in spec order, each parameter checked to be there with its
    shape. The inverse of `match_tensors`. `fixed` gives, by group, the tensor of a spec that
    no parameter holds (SINUSOIDAL: the fixed position table, written as a learned one)."""
    fixed = fixed or {}
    flat = dict(flatten_tree(params))
    return {
        spec.hf_name: fixed[spec.group]
        if spec.group in fixed
        else spec.to_hf(_parameter(flat, spec))
        for spec in specs
    }


def refuse_unexpected(params: Mapping, specs, what: str = "") -> None:
    """Fails naming the parameters of `params` (a tree) that no spec maps (`what`: the model
    they were meant for, e.g. its config)."""
    expected = {spec.path for spec in specs if spec.group != SINUSOIDAL}
    unexpected = sorted("/".join(path) for path, _ in flatten_tree(params) if path not in expected)
    if unexpected:
        raise ValueError(
            f"params: unexpected parameter(s) {name_list(unexpected)}"
            + (f" for {what}" if what else "")
        )


def single_dtype(arrays) -> str | None:
    """The one dtype of `arrays` as config.json's "dtype" names it, or None when they differ."""
    dtypes = {np.dtype(array.dtype) for array in arrays}
    return str(next(iter(dtypes))) if len(dtypes) == 1 else None


def to_numpy(leaf: Any) -> np.ndarray:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        raise ValueError(
            "params hold arrays spread over several processes; gather them first "
            "(jax.experimental.multihost_utils.process_allgather) and save from "
            "one process"
        )
    return np.asarray(jax.device_get(leaf))


def flatten_tree(tree: Mapping, prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from flatten_tree(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def unflatten_tree(flat: Mapping[tuple[str, ...], Any]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def _get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def name_list(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
