"""Raw text -> tokenizer + shards of pretraining instances + manifest (library and CLI).

    python -m bertjax.data.prepare --input corpus/*.txt --output data/ --max_seq_length 128

The parent process streams documents from the input and cuts them into chunks of about
``chunk_mb`` million characters; the cut depends only on the content, never on the worker
count (a corpus of one chunk is done in the parent, without workers). The held-out split is
chosen per document by a hash of (seed, document index), so no document is in both splits.

Each chunk's training documents go to a worker process that tokenizes them, creates instances
with a seed drawn from ``(seed, chunk index)`` and writes its own shard. As google's tool draws
"random next" segments from the documents of its input file set, ours draws them from the
documents of the chunk. At most ``2 * workers`` chunks are in flight, so peak memory follows the
chunk size, not the corpus size.

The held-out documents stay in the parent and become instances together at the end, so that
their random next segments come from the whole eval split: a chunk holds few eval documents
(often one, which would leave it no random next segment at all), and drawing within chunks
would skew the eval NSP labels against train's. This keeps the eval split (``eval_fraction``
of the corpus) in memory.

With ``layout="packed"`` a chunk's (and the eval split's) documents become rows of whole
documents packed together (bertjax.data.packing) instead of sentence pairs: no randomness,
the same division by chunks, and the manifest records the layout and each split's packing
efficiency (real tokens / slots).

The manifest is written last, whole (atomically): a directory without one was never finished.
The output may be a local directory or ``gs://bucket/path`` (every write goes through
bertjax.storage.fs: each shard file is one upload), and so may the inputs.

Over several processes (hosts), ``process_count > 1`` with jax.distributed started (the CLI's
``--distributed`` / ``--coordinator_address --num_processes --process_id``, as training's):
process 0 clears the output and trains the tokenizer once, on its sample, and the others wait
for it at a barrier; then every process streams the same chunks and prepares those whose
index is ``process_index`` modulo ``process_count``, writing their shards into the shared
output and its shard records into ``.parts/``; after a second barrier process 0 writes the
eval split (its documents come from every chunk) and the manifest. The division is by chunk,
the unit one process already hands its workers, and a chunk's shard depends only on its
documents and ``(seed, chunk index)``: the output is byte for byte the one a single process
writes. The price is that every process reads (not tokenizes) the whole input to find the
chunk boundaries, which depend on the characters before them: reading and chunking cost a
fraction of what tokenizing, instance creation and writing do, so the division pays for a
handful of processes; beyond that the reading that every process repeats bounds the gain.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from concurrent import futures

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertjax.data.corpus import InputReport, ReadSettings, expand_paths, read_documents
from bertjax.data.formats import FORMATS
from bertjax.data.instances import TASKS, InstanceSettings, create_instances, tokenize_documents
from bertjax.data.packing import LAYOUTS, efficiency, pack_documents
from bertjax.data.prepare.tokenizer import TOKENIZER_SAMPLE_SENTENCES, make_tokenizer
from bertjax.data.storage import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    SPLITS,
    read_manifest,
    token_dtype,
    write_manifest,
    write_shard,
)
from bertjax.storage import fs
from bertjax.text.tokenizer import SENTENCEPIECE_FILE, Tokenizer
from bertjax.text.training import MODEL_TYPES

DEFAULT_CHUNK_MB = 4.0
# Stream tags of the instance seeds: (seed, chunk index, 0) for each train chunk, (seed, 1) for
# the whole eval split.
_SPLIT_STREAM = {"train": 0, "eval": 1}
# Where processes other than 0 leave their shard records for process 0 (removed after use;
# hidden, so that a directory listing of the output never takes it for data).
PARTS_DIR = ".parts"


def is_eval_document(document_index: int, seed: int, eval_fraction: float) -> bool:
    """Whether a document is held out, from a hash of (seed, its index in the input)."""
    if eval_fraction <= 0.0:
        return False
    digest = hashlib.blake2b(f"{seed}:{document_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < eval_fraction


def _chunks(
    documents: Iterator[list[str]], chunk_chars: int, seed: int, eval_fraction: float
) -> Iterator[tuple[int, dict[str, list[list[str]]], int]]:
    """(chunk index, documents per split, characters) in chunks of about chunk_chars."""
    index = 0
    parts: dict[str, list[list[str]]] = {split: [] for split in SPLITS}
    chars = 0
    for document_index, document in enumerate(documents):
        split = "eval" if is_eval_document(document_index, seed, eval_fraction) else "train"
        parts[split].append(document)
        chars += sum(len(sentence) for sentence in document)
        if chars >= chunk_chars:
            yield index, parts, chars
            index += 1
            parts = {split: [] for split in SPLITS}
            chars = 0
    if chars or any(parts.values()):
        yield index, parts, chars


class _InProcess:
    """The executor of a preparation without worker processes: each chunk is done in this
    process when it is submitted (its error raised there), so that one loop drives both."""

    def __enter__(self) -> _InProcess:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, fn, *args, **kwargs) -> futures.Future:
        future: futures.Future = futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


# Each worker process loads the tokenizer once.
_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_path: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.load(tokenizer_path)


def _process_chunk(
    data_dir: str,
    index: int,
    documents: list[list[str]],
    settings: InstanceSettings,
    seed: int,
    dtype: str,
    layout: str = "pairs",
) -> dict:
    """Tokenizes one chunk's training documents, creates their instances (or packed rows),
    writes their shard."""
    tokenizer = _worker_tokenizer
    assert tokenizer is not None, "worker tokenizer not initialised"
    rng = np.random.default_rng([seed, index, _SPLIT_STREAM["train"]])
    return _write_split(
        data_dir, "train", index, documents, tokenizer, settings, rng, dtype, layout
    )


def _write_split(
    data_dir: str,
    split: str,
    index: int,
    documents: list[list[str]],
    tokenizer: Tokenizer,
    settings: InstanceSettings,
    rng: np.random.Generator,
    dtype: str,
    layout: str = "pairs",
) -> dict:
    """Instances of documents (random next segments drawn among them), or their packed rows
    (layout "packed": no randomness), as shard index of split."""
    tokens = tokenize_documents(documents, tokenizer)
    if layout == "packed":
        instances = pack_documents(
            tokens, settings.max_seq_length, tokenizer.cls_id, tokenizer.sep_id
        )
    else:
        instances = create_instances(tokens, settings, rng, tokenizer.cls_id, tokenizer.sep_id)
    record = {"num_documents": len(tokens), "num_instances": instances.num_instances}
    if record["num_instances"]:
        record["shard"] = write_shard(
            data_dir, split, f"shard-{index:05d}", instances, np.dtype(dtype)
        )
    return record


def _clear_output(data_dir: fs.AnyPath) -> None:
    """Removes a previous manifest first (the directory is unfinished from here on), then shards."""
    with fs.errors(data_dir / MANIFEST_FILE, "remove"):
        (data_dir / MANIFEST_FILE).unlink(missing_ok=True)
    for name in (*SPLITS, PARTS_DIR):
        fs.remove_tree(data_dir / name)


def _barrier(name: str, process_count: int) -> None:
    """Waits until every process has reached `name` (jax.distributed's coordination)."""
    if process_count > 1:
        multihost_utils.sync_global_devices(f"bertjax.data.prepare:{name}")


def _part_path(data_dir: fs.AnyPath, process_index: int) -> fs.AnyPath:
    return data_dir / PARTS_DIR / f"process-{process_index:05d}.json"


def _validate(
    inputs,
    max_seq_length,
    max_predictions_per_seq,
    dupe_factor,
    workers,
    eval_fraction,
    chunk_mb,
    layout="pairs",
) -> None:
    if isinstance(inputs, (str, os.PathLike)) or not inputs:
        raise ValueError(
            f"inputs={inputs!r} is invalid: give a non-empty list of files, globs or directories."
        )
    if max_seq_length < 8:
        raise ValueError(f"max_seq_length={max_seq_length} is invalid: it must be >= 8.")
    if not 1 <= max_predictions_per_seq <= max_seq_length:
        raise ValueError(
            f"max_predictions_per_seq={max_predictions_per_seq} is invalid: it must lie in "
            f"[1, max_seq_length={max_seq_length}]."
        )
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor={dupe_factor} is invalid: it must be >= 1.")
    if workers is not None and workers < 1:
        raise ValueError(
            f"workers={workers} is invalid: it must be >= 1 (or None for one per CPU)."
        )
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} is invalid: it must lie in [0, 1).")
    if chunk_mb <= 0:
        raise ValueError(f"chunk_mb={chunk_mb} is invalid: it must be > 0.")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is invalid: choose one of {LAYOUTS}.")
    if layout == "packed" and dupe_factor != 1:
        raise ValueError(
            f"dupe_factor={dupe_factor} is invalid with layout='packed': packing is not random, "
            "so each pass would repeat the same rows (masking is drawn per batch anyway); use "
            "dupe_factor=1."
        )


def prepare(
    inputs: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
    vocab_size: int = 8000,
    tokenizer_path: str | os.PathLike | None = None,
    dupe_factor: int = 1,
    workers: int | None = None,
    eval_fraction: float = 0.01,
    seed: int = 12345,
    short_seq_prob: float = 0.1,
    task: str = "nsp",
    lowercase: bool = False,
    tokenizer_model_type: str = "unigram",
    tokenizer_sample_sentences: int = TOKENIZER_SAMPLE_SENTENCES,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    verbose: bool = True,
    process_index: int = 0,
    process_count: int = 1,
    layout: str = "pairs",
    read_settings: ReadSettings | None = None,
) -> dict:
    """Prepares ``output_dir`` (local or gs://) from raw text; returns the manifest (also in
    manifest.json).

    Without ``tokenizer_path`` a tokenizer of ``vocab_size`` pieces is trained on a sample
    of the corpus's sentences; with it, that model is copied in and ``vocab_size`` and
    ``lowercase`` are ignored (the model decides).

    ``layout="packed"`` writes rows of whole documents packed together (bertjax.data.packing)
    instead of sentence pairs; ``task`` and ``short_seq_prob`` do not apply to it, and
    ``dupe_factor`` must be 1.

    ``read_settings`` says how the inputs are read: their format (default: by each file's
    name) and the field or column that holds the text (default "text"; bertjax.data.corpus).

    With ``process_count > 1`` every process of a jax.distributed job calls this with the same
    arguments and its own ``process_index``; together they write what one process would (see
    the module's docstring), and each returns the manifest.
    """
    _validate(
        inputs,
        max_seq_length,
        max_predictions_per_seq,
        dupe_factor,
        workers,
        eval_fraction,
        chunk_mb,
        layout,
    )
    inputs = [str(p) for p in inputs]
    read_settings = read_settings or ReadSettings()
    expand_paths(inputs)  # a bad path fails here, before the output directory is touched
    instance_settings = InstanceSettings(
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        task=task,
    )
    _check_processes(process_index, process_count)
    workers = workers or os.cpu_count() or 1
    data_dir = fs.makedirs(output_dir)
    lead = process_index == 0
    log = print if verbose and lead else (lambda *args, **kwargs: None)

    start = time.perf_counter()
    tokenizer = _shared_tokenizer(
        data_dir,
        lead,
        process_count,
        inputs,
        tokenizer_path,
        vocab_size,
        tokenizer_model_type,
        lowercase,
        tokenizer_sample_sentences,
        seed,
        log,
        read_settings,
    )
    tokenizer_seconds = time.perf_counter() - start
    dtype = token_dtype(tokenizer.vocab_size)

    report = InputReport()
    start = time.perf_counter()
    chunked = _prepare_chunks(
        data_dir,
        inputs,
        report,
        read_settings,
        chunk_mb,
        seed,
        eval_fraction,
        instance_settings,
        dtype,
        layout,
        workers,
        process_index,
        process_count,
    )
    if not lead:
        _hand_over(data_dir, chunked, process_index, (print if verbose else log), start)
        _barrier("shares", process_count)
        _barrier("manifest", process_count)
        return read_manifest(data_dir)
    _barrier("shares", process_count)
    train_records = _gathered_records(data_dir, chunked, process_count)
    # One pool for the whole eval split; its own seed stream, so train's draws are untouched.
    eval_rng = np.random.default_rng([seed, _SPLIT_STREAM["eval"]])
    eval_record = _write_split(
        str(data_dir),
        "eval",
        0,
        chunked.eval_documents,
        tokenizer,
        instance_settings,
        eval_rng,
        dtype,
        layout,
    )
    seconds = time.perf_counter() - start

    splits = _split_summaries(train_records, eval_record, layout, max_seq_length)
    if splits["train"]["num_instances"] == 0:
        raise ValueError(f"inputs {inputs} produced no training instances (is the corpus empty?).")
    manifest = {
        "format_version": FORMAT_VERSION,
        "max_seq_length": max_seq_length,
        "max_predictions_per_seq": max_predictions_per_seq,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "token_dtype": dtype.name,
        "splits": splits,
        "input_report": report.to_dict(),
        "settings": {
            "inputs": inputs,
            # How they were read; a manifest without these read them by name, text in "text".
            "format": read_settings.format,
            "text_field": read_settings.text_field,
            "id_field": read_settings.id_field,
            "dupe_factor": dupe_factor,
            "short_seq_prob": short_seq_prob,
            "task": task,
            "eval_fraction": eval_fraction,
            "seed": seed,
            "chunk_mb": chunk_mb,
            "tokenizer": str(tokenizer_path) if tokenizer_path is not None else None,
            "lowercase": lowercase if tokenizer_path is None else None,
        },
        "num_chunks": len(train_records),
        "raw_chars": chunked.raw_chars,
    }
    if layout != "pairs":  # a manifest without it holds pairs (what every older one holds)
        manifest["layout"] = layout
    write_manifest(data_dir, manifest)
    _barrier("manifest", process_count)
    log(str(report))
    if layout == "packed":
        log(
            "Packed documents into rows of "
            f"{max_seq_length} slots: packing efficiency (real tokens / slots) "
            f"{splits['train']['packing_efficiency']:.4f} train, "
            f"{splits['eval']['packing_efficiency']:.4f} eval"
        )
    log(
        f"Prepared {splits['train']['num_instances']} train and {splits['eval']['num_instances']} "
        f"eval instances from {chunked.raw_chars / 1e6:.1f} M characters in {seconds:.1f}s with "
        f"{workers} worker(s) x {process_count} process(es) (tokenizer: "
        f"{tokenizer_seconds:.1f}s) into {data_dir}"
    )
    return manifest


def _check_processes(process_index: int, process_count: int) -> None:
    """Fails unless process_index is one of process_count processes that jax.distributed runs."""
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} is invalid for process_count={process_count}: "
            f"valid indices are 0..{process_count - 1}."
        )
    if process_count > 1 and jax.process_count() != process_count:
        raise ValueError(
            f"process_count={process_count} but jax.distributed runs {jax.process_count()} "
            "process(es); start it first (jax.distributed.initialize, or the --distributed / "
            "--coordinator_address --num_processes --process_id flags)."
        )


def _shared_tokenizer(
    data_dir: fs.AnyPath,
    lead: bool,
    process_count: int,
    inputs: list[str],
    tokenizer_path: str | os.PathLike | None,
    vocab_size: int,
    model_type: str,
    lowercase: bool,
    sample_sentences: int,
    seed: int,
    log,
    read_settings: ReadSettings,
) -> Tokenizer:
    """The output's tokenizer: process 0 clears the output and makes it (`make_tokenizer`),
    the other processes read it once it is written."""
    tokenizer_file = data_dir / SENTENCEPIECE_FILE
    if lead:
        _clear_output(data_dir)
        tokenizer = make_tokenizer(
            inputs,
            tokenizer_file,
            tokenizer_path,
            vocab_size,
            model_type,
            lowercase,
            sample_sentences,
            seed,
            log,
            read_settings,
        )
    _barrier("tokenizer", process_count)
    if not lead:
        tokenizer = Tokenizer.load(tokenizer_file)
    return tokenizer


@dataclasses.dataclass
class _Chunked:
    """What one pass over the input's chunks gave this process."""

    train_records: dict[int, dict]  # the shard record of each train chunk this process did
    eval_documents: list[list[str]]  # every chunk's held-out documents (process 0 only)
    num_chunks: int
    raw_chars: int


def _prepare_chunks(
    data_dir: fs.AnyPath,
    inputs: list[str],
    report: InputReport,
    read_settings: ReadSettings,
    chunk_mb: float,
    seed: int,
    eval_fraction: float,
    instance_settings: InstanceSettings,
    dtype: np.dtype,
    layout: str,
    workers: int,
    process_index: int,
    process_count: int,
) -> _Chunked:
    """Streams the input's chunks; the train documents of this process's chunks become shards
    in the workers, the held-out documents are kept (process 0) for the eval split."""
    lead = process_index == 0

    def mine(index: int) -> bool:
        return index % process_count == process_index

    documents = read_documents(inputs, report, settings=read_settings)
    chunks = _chunks(documents, int(chunk_mb * 1e6), seed, eval_fraction)
    task_args = (str(data_dir),)
    task_kwargs = dict(settings=instance_settings, seed=seed, dtype=dtype.name, layout=layout)
    train_records: dict[int, dict] = {}
    eval_documents: list[list[str]] = []
    num_chunks = 0
    raw_chars = 0
    tokenizer_file = data_dir / SENTENCEPIECE_FILE
    # A corpus of a single chunk is done in this process: starting workers would cost more.
    head = list(itertools.islice(chunks, 2))
    chunks = itertools.chain(head, chunks)
    if workers == 1 or len(head) < 2:
        _init_worker(str(tokenizer_file))
        pool = _InProcess()
    else:
        # Workers fork from a fresh server process: the caller may be multithreaded (jax),
        # where a plain fork is unsafe, and may run from a notebook, where spawn cannot
        # re-import the main module.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["bertjax.data.prepare"])
        pool = futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init_worker, initargs=(str(tokenizer_file),)
        )
    with pool:
        pending: collections.deque = collections.deque()
        for index, parts, chars in chunks:
            num_chunks += 1
            raw_chars += chars
            if lead:
                eval_documents.extend(parts["eval"])
            if not mine(index):
                continue
            future = pool.submit(_process_chunk, *task_args, index, parts["train"], **task_kwargs)
            pending.append((index, future))
            while len(pending) >= 2 * workers:  # bounds the chunks in flight, and memory
                done_index, result = pending.popleft()
                train_records[done_index] = result.result()
        while pending:
            done_index, result = pending.popleft()
            train_records[done_index] = result.result()
    if not num_chunks:
        raise ValueError(f"inputs {inputs} hold no documents.")
    return _Chunked(train_records, eval_documents, num_chunks, raw_chars)


def _hand_over(
    data_dir: fs.AnyPath, chunked: _Chunked, process_index: int, log, start: float
) -> None:
    """A process other than 0 leaves the shard records of its chunks for process 0."""
    fs.write_text(
        _part_path(data_dir, process_index),
        json.dumps({str(index): record for index, record in chunked.train_records.items()}),
    )
    log(
        f"Process {process_index}: prepared {len(chunked.train_records)} of "
        f"{chunked.num_chunks} chunks in {time.perf_counter() - start:.1f}s into {data_dir}"
    )


def _gathered_records(
    data_dir: fs.AnyPath, chunked: _Chunked, process_count: int
) -> dict[int, dict]:
    """Process 0's records and every other process's (then removed): one per chunk."""
    train_records = dict(chunked.train_records)
    for other in range(1, process_count):
        part = json.loads(fs.read_text(_part_path(data_dir, other)))
        train_records.update({int(index): record for index, record in part.items()})
    fs.remove_tree(data_dir / PARTS_DIR)
    if len(train_records) != chunked.num_chunks:
        missing = sorted(set(range(chunked.num_chunks)) - set(train_records))
        raise RuntimeError(f"chunks {missing[:10]} of {data_dir} were prepared by no process")
    return train_records


def _split_summaries(
    train_records: dict[int, dict], eval_record: dict, layout: str, max_seq_length: int
) -> dict[str, dict]:
    """The manifest's entry of each split: documents, instances, tokens, shards (and, packed,
    the packing efficiency)."""
    splits = {}
    for split, records in (
        ("train", [train_records[i] for i in sorted(train_records)]),
        ("eval", [eval_record]),
    ):
        shards = [r["shard"] for r in records if "shard" in r]
        splits[split] = {
            "num_documents": sum(r["num_documents"] for r in records),
            "num_instances": sum(s["num_instances"] for s in shards),
            "num_tokens": sum(s["num_tokens"] for s in shards),
            "shards": shards,
        }
        if layout == "packed":
            splits[split]["packing_efficiency"] = efficiency(
                splits[split]["num_tokens"], splits[split]["num_instances"], max_seq_length
            )
    return splits


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m bertjax.data.prepare",
        description="Tokenize a raw text corpus and write shards of BERT pretraining instances.",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="files, globs or directories (.txt, .jsonl, .json, .parquet; .gz, .zst, .zstd)",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="auto", help="how to read the inputs (auto: by name)"
    )
    parser.add_argument(
        "--text_field",
        default="text",
        help="the JSON Lines field or parquet column of the text; a dotted path for nested ones",
    )
    parser.add_argument(
        "--id_field", default="", help="a field naming documents in the report of bad input"
    )
    parser.add_argument("--output", required=True, help="the directory to write")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    vocab = parser.add_mutually_exclusive_group()
    vocab.add_argument(
        "--vocab_size", type=int, default=8000, help="train a tokenizer of this size"
    )
    vocab.add_argument("--tokenizer", default=None, help="use this sentencepiece .model instead")
    parser.add_argument("--dupe_factor", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: one per CPU)"
    )
    parser.add_argument("--eval_fraction", type=float, default=0.01)
    parser.add_argument("--short_seq_prob", type=float, default=0.1)
    parser.add_argument("--task", choices=TASKS, default="nsp")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="pairs",
        help="pairs: [CLS] A [SEP] B [SEP] instances; packed: whole documents packed into rows",
    )
    parser.add_argument("--lowercase", action="store_true")
    parser.add_argument(
        "--tokenizer_model_type",
        choices=MODEL_TYPES,
        default="unigram",
        help="sentencepiece algorithm when training a tokenizer",
    )
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--chunk_mb", type=float, default=DEFAULT_CHUNK_MB)
    # The same flags as training's (bertjax.cli) to spread the work over processes or hosts.
    parser.add_argument(
        "--distributed", action="store_true", help="call jax.distributed.initialize()"
    )
    parser.add_argument("--coordinator_address", default=None, help="host:port of process 0")
    parser.add_argument("--num_processes", type=int, default=None, help="number of processes")
    parser.add_argument("--process_id", type=int, default=None, help="this process's index")
    args = parser.parse_args(argv)
    process_index, process_count = 0, 1
    if args.distributed or args.coordinator_address:
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
        process_index, process_count = jax.process_index(), jax.process_count()
    return prepare(
        args.input,
        args.output,
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        vocab_size=args.vocab_size,
        tokenizer_path=args.tokenizer,
        dupe_factor=args.dupe_factor,
        workers=args.workers,
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        short_seq_prob=args.short_seq_prob,
        task=args.task,
        lowercase=args.lowercase,
        tokenizer_model_type=args.tokenizer_model_type,
        chunk_mb=args.chunk_mb,
        process_index=process_index,
        process_count=process_count,
        layout=args.layout,
        read_settings=ReadSettings(args.format, args.text_field, args.id_field),
    )
