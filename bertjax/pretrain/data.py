"""A pretraining run's data: prepared on first use, checked against the run's settings.

A run names either its inputs (one corpus, prepared into data.dir or <workdir>/data) or a
weighted mixture of sources (data.sources): each source is then prepared into its own
directory, ``<root>/sources/<name>-<fingerprint>`` under data.dir or <workdir>/data, where the
fingerprint covers the source's files (names and sizes), how they are read, the preparation
settings and the tokenizer. A run that names the same files and tokenizer finds the directory
and reuses it; adding a source prepares that source alone when the tokenizer stays (given, or
a new phase's). All sources share one tokenizer:
data.tokenizer, else a new phase's (init_from), else one trained on an equal sample of every
source (bertjax.data.prepare.tokenizer.train_mixture_tokenizer), kept beside the sources as
``<root>/sources/tokenizer-<fingerprint>.model`` (its fingerprint covers the sources' names,
files and reading, and the tokenizer settings, not the weights or order), so that runs of the
same sources share it whatever their weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertjax import data as data_lib
from bertjax.data.corpus import ReadSettings, expand_paths
from bertjax.data.mixture import Source
from bertjax.engine.rundir import CORPUS_DIR, DATA_DIR
from bertjax.engine.settings import ConfigError
from bertjax.pretrain.settings import DataSettings
from bertjax.storage import fs
from bertjax.text.tokenizer import SENTENCEPIECE_FILE, Tokenizer

SOURCES_DIR = "sources"


@dataclasses.dataclass(frozen=True)
class PreparedSource:
    """A source of a mixture and the directory it is prepared in."""

    source: Source
    dir: fs.AnyPath
    reused: bool  # found prepared by an earlier run

    def to_dict(self) -> dict:
        return {**self.source.to_dict(), "dir": str(self.dir)}


def ensure_data(
    data: DataSettings,
    workdir: str | os.PathLike,
    *,
    eval_batch_size: int,
    seed: int,
    default_tokenizer: fs.AnyPath | None = None,
) -> tuple[fs.AnyPath, Tokenizer]:
    """(prepared data directory, its tokenizer), preparing it when it has none.

    Data prepared here is tokenized by data.tokenizer, else by `default_tokenizer` (a new
    phase's: the one its parameters were trained with), else by a tokenizer trained on it.

    With neither data.dir nor data.input set, the built-in demo corpus is prepared into
    <workdir>/data. With several processes each prepares its share of the input into the
    shared directory (bertjax.data.prepare), and all wait until the manifest is written. The
    prepared data must fit the run: its sequence length, its tokenizer (when the config
    names one), its layout (pairs or packed documents) and an eval split of at least one batch.
    """
    workdir = fs.path(workdir)
    data_dir = fs.path(data.dir) if data.dir else workdir / DATA_DIR
    processes = jax.process_count()
    missing = not (data_dir / data_lib.MANIFEST_FILE).exists()
    if processes > 1:  # process 0's answer for all: a listing may differ between hosts
        missing = bool(multihost_utils.broadcast_one_to_all(np.asarray(missing)))
    if missing:
        inputs = list(data.inputs)
        if not inputs:
            corpus_dir = workdir / CORPUS_DIR
            if jax.process_index() == 0:
                data_lib.demo_corpus_path(corpus_dir)
            if processes > 1:
                multihost_utils.sync_global_devices("bertjax:demo_corpus_written")
            inputs = [str(data_lib.demo_corpus_path(corpus_dir))]
            if jax.process_index() == 0:
                print(f"No data.input given: using the built-in demo corpus {inputs[0]}")
        if jax.process_index() == 0:
            print(f"Preparing data into {data_dir} over {processes} process(es) ...")
        tokenizer_path = data.tokenizer or (str(default_tokenizer) if default_tokenizer else None)
        _prepare(data, inputs, data_dir, tokenizer_path, seed, ReadSettings())
    if processes > 1:
        multihost_utils.sync_global_devices("bertjax:data_prepared")
    return data_dir, _checked(data, data_dir, workdir, eval_batch_size)


def ensure_sources(
    data: DataSettings,
    workdir: str | os.PathLike,
    *,
    eval_batch_size: int,
    seed: int,
    default_tokenizer: fs.AnyPath | None = None,
) -> tuple[list[PreparedSource], Tokenizer]:
    """(each source of data.sources with its prepared directory, their tokenizer), preparing
    those not prepared yet (module docstring). The first source's held-out split is the run's
    eval split: it must fit the run as ensure_data's does."""
    workdir = fs.path(workdir)
    root = (fs.path(data.dir) if data.dir else workdir / DATA_DIR) / SOURCES_DIR
    processes = jax.process_count()
    tokenizer_path = data.tokenizer or (str(default_tokenizer) if default_tokenizer else None)
    # What a directory that trained its own tokenizer was fingerprinted with.
    trained = {
        "vocab_size": data.vocab_size,
        "model_type": data.tokenizer_model_type,
        "lowercase": data.lowercase,
    }
    if tokenizer_path is None:
        tokenizer_path = str(_mixture_tokenizer(data, root, seed))
    tokenizer_id = Tokenizer.load(tokenizer_path).fingerprint
    prepared: list[PreparedSource] = []
    for source in data.sources:
        directory = root / f"{source.name}-{source_fingerprint(source, data, seed, tokenizer_id)}"
        # A source that trained its own directory's tokenizer (a previous phase's first
        # source, before mixtures trained theirs on every source) was prepared under the
        # training settings' fingerprint: reuse it too when that is the tokenizer.
        candidates = [
            directory,
            root / f"{source.name}-{source_fingerprint(source, data, seed, trained)}",
        ]
        found = next(
            (
                index
                for index, candidate in enumerate(candidates)
                if _prepared_with(candidate, tokenizer_id if index else None)
            ),
            -1,
        )
        if processes > 1:  # process 0's answer for all
            found = int(multihost_utils.broadcast_one_to_all(np.asarray(found)))
        missing = found < 0
        directory = directory if missing else candidates[found]
        if missing:
            if jax.process_index() == 0:
                print(f"Preparing source {source.name!r} into {directory} ...")
            try:
                _prepare(
                    data, list(source.paths), directory, tokenizer_path, seed, source.read_settings
                )
            except (ValueError, FileNotFoundError) as err:
                raise type(err)(f"config.data.sources: source {source.name!r}: {err}") from None
        elif jax.process_index() == 0:
            print(f"Source {source.name!r}: reusing the data prepared in {directory}")
        if processes > 1:
            multihost_utils.sync_global_devices(f"bertjax:source_prepared:{source.name}")
        prepared.append(PreparedSource(source, directory, reused=not missing))
    return prepared, _checked(data, prepared[0].dir, workdir, eval_batch_size)


def _mixture_tokenizer(data: DataSettings, root: fs.AnyPath, seed: int) -> fs.AnyPath:
    """The tokenizer of data.sources trained on an equal sample of each (module docstring):
    found under root when an earlier run trained it, else trained there by process 0 while
    the others wait."""
    described = {
        "sources": [
            [
                source.name,
                [[str(f), fs.size(f)] for f in expand_paths(list(source.paths))],
                dataclasses.asdict(source.read_settings),
            ]
            for source in sorted(data.sources, key=lambda source: source.name)
        ],
        "vocab_size": data.vocab_size,
        "model_type": data.tokenizer_model_type,
        "lowercase": data.lowercase,
        "sample_sentences": data_lib.TOKENIZER_SAMPLE_SENTENCES,
        "seed": seed,
    }
    text = json.dumps(described, sort_keys=True)
    path = root / f"tokenizer-{hashlib.blake2b(text.encode(), digest_size=8).hexdigest()}.model"
    missing = not path.exists()
    if jax.process_count() > 1:  # process 0's answer for all
        missing = bool(multihost_utils.broadcast_one_to_all(np.asarray(missing)))
    lead = jax.process_index() == 0
    if missing and lead:
        print(f"Training the mixture's tokenizer on every source into {path} ...")
        try:
            data_lib.train_mixture_tokenizer(
                [
                    (source.name, list(source.paths), source.read_settings)
                    for source in data.sources
                ],
                path,
                vocab_size=data.vocab_size,
                model_type=data.tokenizer_model_type,
                lowercase=data.lowercase,
                sample_sentences=data_lib.TOKENIZER_SAMPLE_SENTENCES,
                seed=seed,
            )
        except ValueError as err:
            raise ValueError(f"config.data.sources: training their tokenizer: {err}") from None
    elif lead:
        print(f"Reusing the mixture's tokenizer {path}")
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("bertjax:mixture_tokenizer")
    return path


def _prepared_with(directory: fs.AnyPath, tokenizer_fingerprint: str | None) -> bool:
    """Whether directory holds finished prepared data (of that tokenizer, when given)."""
    if not (directory / data_lib.MANIFEST_FILE).exists():
        return False
    if tokenizer_fingerprint is None:
        return True
    return data_lib.read_manifest(directory)["tokenizer_fingerprint"] == tokenizer_fingerprint


def source_fingerprint(source: Source, data: DataSettings, seed: int, tokenizer_id) -> str:
    """What a source's prepared directory depends on, hashed: its files (names and sizes), how
    they are read, the preparation settings, the seed and the tokenizer."""
    files = [[str(f), fs.size(f)] for f in expand_paths(list(source.paths))]
    described = {
        "files": files,
        "read": dataclasses.asdict(source.read_settings),
        "max_seq_length": data.max_seq_length,
        "max_predictions_per_seq": data.masking.max_predictions_per_seq,
        "task": data.task,
        "dupe_factor": data.dupe_factor,
        "short_seq_prob": data.short_seq_prob,
        "eval_fraction": data.eval_fraction,
        "layout": data.layout,
        "seed": seed,
        "tokenizer": tokenizer_id,
    }
    text = json.dumps(described, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _prepare(
    data: DataSettings,
    inputs: list[str],
    data_dir: fs.AnyPath,
    tokenizer_path: str | None,
    seed: int,
    read_settings: ReadSettings,
) -> None:
    """Prepares inputs into data_dir with the run's settings. Every process prepares its share
    of the chunks into the shared directory; prepare itself waits for all of them before
    process 0 writes the manifest."""
    data_lib.prepare(
        inputs,
        data_dir,
        max_seq_length=data.max_seq_length,
        max_predictions_per_seq=data.masking.max_predictions_per_seq,
        vocab_size=data.vocab_size,
        tokenizer_path=tokenizer_path,
        tokenizer_model_type=data.tokenizer_model_type,
        lowercase=data.lowercase,
        task=data.task,
        dupe_factor=data.dupe_factor,
        short_seq_prob=data.short_seq_prob,
        eval_fraction=data.eval_fraction,
        workers=data.workers or None,
        seed=seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        layout=data.layout,
        read_settings=read_settings,
    )


def _checked(
    data: DataSettings, data_dir: fs.AnyPath, workdir: fs.AnyPath, eval_batch_size: int
) -> Tokenizer:
    """The tokenizer of data_dir, once its data is checked against the run (copied beside the
    checkpoints)."""
    manifest = data_lib.read_manifest(data_dir)
    if manifest["max_seq_length"] != data.max_seq_length:
        raise ConfigError(
            f"config.data.max_seq_length={data.max_seq_length} but {data_dir} was prepared "
            f"with max_seq_length={manifest['max_seq_length']}; prepare a new directory or "
            "match it"
        )
    layout = manifest.get("layout", "pairs")
    if layout != data.layout:
        raise ConfigError(
            f"config.data.layout={data.layout!r} but {data_dir} was prepared with "
            f"layout={layout!r}; prepare a new directory or match it"
        )
    tokenizer = Tokenizer.load(data_dir / SENTENCEPIECE_FILE)
    if data.tokenizer:
        wanted = Tokenizer.load(data.tokenizer)
        if wanted.fingerprint != tokenizer.fingerprint:
            raise ConfigError(
                f"config.data.tokenizer={data.tokenizer!r} (fingerprint "
                f"{wanted.fingerprint[:12]}) is not the tokenizer {data_dir} was prepared with "
                f"({tokenizer.fingerprint[:12]})"
            )
    eval_examples = manifest["splits"]["eval"]["num_instances"]
    if eval_examples < eval_batch_size:
        raise ConfigError(
            f"config.data.eval_fraction={data.eval_fraction}: {data_dir} holds "
            f"{eval_examples} eval instances, fewer than one eval batch ({eval_batch_size} = "
            "batch_size / grad_accum_steps); prepare with a larger eval fraction"
        )
    if jax.process_index() == 0:  # bertjax.load finds the tokenizer beside the checkpoints
        fs.copy(data_dir / SENTENCEPIECE_FILE, workdir / SENTENCEPIECE_FILE)
    return tokenizer
