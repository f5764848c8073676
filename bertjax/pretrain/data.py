"""A pretraining run's data: prepared on first use, checked against the run's settings."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertjax import data as data_lib
from bertjax import fs
from bertjax.pretrain.settings import DataSettings
from bertjax.rundir import CORPUS_DIR, DATA_DIR
from bertjax.settings import ConfigError
from bertjax.tokenizer import SENTENCEPIECE_FILE, Tokenizer


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
        # Every process prepares its share of the chunks into the shared directory; prepare
        # itself waits for all of them before process 0 writes the manifest.
        data_lib.prepare(
            inputs,
            data_dir,
            max_seq_length=data.max_seq_length,
            max_predictions_per_seq=data.masking.max_predictions_per_seq,
            vocab_size=data.vocab_size,
            tokenizer_path=data.tokenizer
            or (str(default_tokenizer) if default_tokenizer else None),
            tokenizer_model_type=data.tokenizer_model_type,
            lowercase=data.lowercase,
            task=data.task,
            dupe_factor=data.dupe_factor,
            short_seq_prob=data.short_seq_prob,
            eval_fraction=data.eval_fraction,
            workers=data.workers or None,
            seed=seed,
            process_index=jax.process_index(),
            process_count=processes,
            layout=data.layout,
        )
    if processes > 1:
        multihost_utils.sync_global_devices("bertjax:data_prepared")

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
    return data_dir, tokenizer
