"""Data pipeline throughput: tokenizer training, prepare (per worker, with peak RSS), loader;
preparation per shipped format; a mixture's loader against one source's.

    python benchmarks/data.py [--synthetic_mb 32] [--workers 1 2] [--work_dir runs/bench_data]
    python benchmarks/data.py --sections formats mixture [--formats_mb 8]

Uses the demo corpus (the interpreter's own documentation) and, with --synthetic_mb, a larger
corpus made by reshuffling its sentences into new documents. The loader is measured on one
core (no prefetch threads) at max_seq_length=128, batch_size=256.

Section "formats" writes the same documents (a synthetic corpus of --formats_mb MB) as
google's text, JSON Lines in gzip and in zstd, and parquet, then prepares each with one worker:
MB/s (of document text) and tokens/s per core, and the reading alone (documents/s). Section
"mixture" prepares the three sources of bertjax.data.demo_sources (parquet, zstd and gzip JSON
Lines) with one tokenizer and times the three-source mixture's loader against one source's, in
alternating rounds so that both see the same machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import resource
import sys
import threading
import time

import numpy as np

# Loader throughput is a one-core figure: keep numpy's BLAS pools from spreading out.
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import gzip  # noqa: E402
import json  # noqa: E402

import zstandard  # noqa: E402

from bertjax.data import MaskingSettings, demo_corpus_path, make_loader, prepare  # noqa: E402
from bertjax.data.corpus import InputReport, ReadSettings, read_documents  # noqa: E402
from bertjax.data.demo_sources import write_sources  # noqa: E402
from bertjax.data.formats import pyarrow_modules  # noqa: E402
from bertjax.data.mixture import make_mixture_loader, parse_sources  # noqa: E402
from bertjax.text.training import TokenizerSettings, train_tokenizer  # noqa: E402


def peak_rss_mb() -> tuple[float, float]:
    """Peak resident set size of this process and of its largest reaped child, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


class TreeMemory:
    """Samples the RSS of this process and all its descendants (Linux /proc) in a thread.

    Worker processes of a forkserver are not our direct children, so getrusage's
    RUSAGE_CHILDREN never sees them; sampling the process tree does.
    """

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak_total_mb = 0.0
        self.peak_single_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _tree_rss_mb() -> list[float]:
        parents, rss = {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            parents[int(entry)] = int(fields["PPid"])
            rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
        root, found = os.getpid(), []
        for pid in rss:
            walk = pid
            while walk not in (root, 0, 1) and walk in parents:
                walk = parents[walk]
            if walk == root:
                found.append(rss[pid])
        return found

    def _run(self):
        while not self._stop.is_set():
            sizes = self._tree_rss_mb()
            self.peak_total_mb = max(self.peak_total_mb, sum(sizes))
            self.peak_single_mb = max(self.peak_single_mb, max(sizes, default=0.0))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def synthetic_corpus(
    source: pathlib.Path, target_mb: float, path: pathlib.Path, seed: int = 0
) -> pathlib.Path:
    """A corpus of about target_mb MB: the source's sentences reshuffled into new documents."""
    if path.is_file() and path.stat().st_size >= target_mb * 1e6 * 0.95:
        return path
    sentences = [s for doc in read_documents([str(source)], InputReport()) for s in doc]
    rng = np.random.default_rng(seed)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_mb * 1e6:
            for _ in range(1000):
                picks = rng.integers(0, len(sentences), size=rng.integers(3, 30))
                text = "\n".join(sentences[i] for i in picks) + "\n\n"
                f.write(text)
                written += len(text.encode())
    return path


def bench_prepare(
    corpus: pathlib.Path, tokenizer: pathlib.Path, out: pathlib.Path, workers: int
) -> None:
    size_mb = corpus.stat().st_size / 1e6
    with TreeMemory() as memory:
        start = time.perf_counter()
        manifest = prepare(
            [str(corpus)],
            out,
            tokenizer_path=tokenizer,
            workers=workers,
            dupe_factor=1,
            max_seq_length=128,
            verbose=False,
        )
        seconds = time.perf_counter() - start
    instances = sum(split["num_instances"] for split in manifest["splits"].values())
    own, children = peak_rss_mb()
    print(
        f"prepare {corpus.name} ({size_mb:.1f} MB) workers={workers}: {seconds:.2f}s, "
        f"{size_mb / seconds / workers:.2f} MB/s per worker ({size_mb / seconds:.2f} MB/s total), "
        f"{instances / seconds / workers:.0f} instances/s per worker, {instances} instances; "
        f"peak RSS: self+descendants {memory.peak_total_mb:.0f} MB (sampled), largest single "
        f"process {memory.peak_single_mb:.0f} MB; getrusage self {own:.0f} MB, "
        f"reaped children {children:.0f} MB"
    )


def bench_loader(data_dir: pathlib.Path, whole_word_masking: bool, seconds: float = 5.0) -> None:
    loader = make_loader(
        data_dir,
        batch_size=256,
        seed=0,
        process_index=0,
        process_count=1,
        masking=MaskingSettings(whole_word_masking=whole_word_masking),
    )
    next(loader)
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(loader)
        count += 1
    rate = count * 256 / (time.perf_counter() - start)
    print(
        f"loader S=128 B=256 whole_word_masking={whole_word_masking}: "
        f"{rate:,.0f} masked sequences/s "
        f"({loader.num_examples} examples)"
    )


def write_formats(corpus: pathlib.Path, directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """The corpus's documents in each shipped format: {format: file}. Google's text holds a
    sentence per line; the others hold each document's sentences joined by spaces, which the
    reader splits into sentences again (as it does a shipped corpus's text)."""
    directory.mkdir(parents=True, exist_ok=True)
    documents = list(read_documents([str(corpus)], InputReport()))
    texts = [" ".join(doc) for doc in documents]
    files = {
        "text": directory / "corpus.txt",
        "jsonl.gz": directory / "corpus.jsonl.gz",
        "jsonl.zst": directory / "corpus.jsonl.zst",
        "parquet": directory / "corpus.parquet",
    }
    files["text"].write_text("".join("\n".join(d) + "\n\n" for d in documents), encoding="utf-8")
    lines = "".join(json.dumps({"text": text}) + "\n" for text in texts).encode()
    files["jsonl.gz"].write_bytes(gzip.compress(lines))
    files["jsonl.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(lines))
    pa, pq, _ = pyarrow_modules()
    pq.write_table(pa.table({"text": texts}), files["parquet"], row_group_size=10_000)
    return files


def bench_formats(corpus: pathlib.Path, tokenizer: pathlib.Path, work: pathlib.Path) -> None:
    files = write_formats(corpus, work / "formats")
    for name, path in files.items():
        start = time.perf_counter()
        report = InputReport()
        documents = sum(1 for _ in read_documents([str(path)], report))
        read_seconds = time.perf_counter() - start
        start = time.perf_counter()
        manifest = prepare(
            [str(path)],
            work / f"prepared_format_{name}",
            tokenizer_path=tokenizer,
            workers=1,
            dupe_factor=1,
            max_seq_length=128,
            verbose=False,
        )
        seconds = time.perf_counter() - start
        text_mb = manifest["raw_chars"] / 1e6
        tokens = sum(split["num_tokens"] for split in manifest["splits"].values())
        print(
            f"format {name:<9} file {path.stat().st_size / 1e6:6.2f} MB: read {documents} "
            f"documents in {read_seconds:.2f}s ({documents / read_seconds:,.0f} documents/s); "
            f"prepare (1 core) {seconds:.2f}s = {text_mb / seconds:.2f} MB/s of text, "
            f"{tokens / seconds:,.0f} tokens/s per core"
        )


def _cpu_ms_per_batch(loader, batches: int) -> float:
    """CPU milliseconds per batch over `batches` batches (process time: other work on a shared
    machine does not count; the loader makes its batches in this thread)."""
    start = time.process_time()
    for _ in range(batches):
        next(loader)
    return (time.process_time() - start) / batches * 1e3


def _side_by_side(label: str, single, mixture, rounds: int, batches: int = 60) -> None:
    """The single-source loader and the mixture's, timed in alternating rounds."""
    next(single), next(mixture)
    singles, mixtures = [], []
    for _ in range(rounds):  # alternating, so that both see the same machine
        singles.append(_cpu_ms_per_batch(single, batches))
        mixtures.append(_cpu_ms_per_batch(mixture, batches))
    one, three = float(np.median(singles)), float(np.median(mixtures))
    cost = (three / one - 1) * 100
    print(
        f"loader S=128 B=256, one core, {label}: one source {1e3 / one:.0f} batches/s, "
        f"three-source mixture {1e3 / three:.0f} batches/s (CPU time, median of {rounds} "
        f"alternating rounds of {batches} batches): the mixture costs {cost:+.1f}%"
    )


def bench_mixture(work: pathlib.Path, tokenizer: pathlib.Path, rounds: int = 31) -> None:
    demo = demo_corpus_path(work / "corpus")
    sources = parse_sources(write_sources(read_documents([str(demo)], InputReport()), work / "mix"))
    common = dict(tokenizer_path=tokenizer, workers=1, dupe_factor=1, max_seq_length=128)
    prepared = []
    for source in sources:
        directory = work / f"prepared_mix_{source.name}"
        settings = ReadSettings(source.format, source.text_field, source.id_field)
        prepare(list(source.paths), directory, verbose=False, read_settings=settings, **common)
        prepared.append((source, directory))
    whole = work / "prepared_mix_whole"  # the same documents as one source
    prepare([str(demo)], whole, verbose=False, **common)
    kwargs = dict(batch_size=256, seed=0, process_index=0, process_count=1)
    mixture = make_mixture_loader(prepared, **kwargs)
    _side_by_side(
        "the three formats' sources against their documents as one source",
        make_loader(whole, **kwargs),
        mixture,
        rounds,
    )
    # The mixture's own cost, apart from what its rows hold: the same prepared data as three
    # sources of 0.6 / 0.3 / 0.1.
    copies = [(dataclasses.replace(s, name=f"copy{i}"), whole) for i, (s, _) in enumerate(prepared)]
    _side_by_side(
        "the same data as one source and as three",
        make_loader(whole, **kwargs),
        make_mixture_loader(copies, **kwargs),
        rounds,
    )
    # The same again against one source of as many shards as the three copies have: a large
    # corpus is many shards, and a batch that spans several gathers from each (as here).
    sharded = work / "prepared_mix_whole_3_shards"
    prepare([str(demo)], sharded, verbose=False, chunk_mb=demo.stat().st_size / 3.2e6, **common)
    _side_by_side(
        "the same data as one source of three shards and as three sources",
        make_loader(sharded, **kwargs),
        make_mixture_loader(copies, **kwargs),
        rounds,
    )
    print(
        "realised shares after the rounds: "
        + ", ".join(f"{k} {v:.4f}" for k, v in mixture.shares().items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", default="runs/bench_data")
    parser.add_argument(
        "--synthetic_mb", type=float, default=32.0, help="0 to skip the larger corpus"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=("prepare", "formats", "mixture"),
        default=["prepare", "formats", "mixture"],
    )
    parser.add_argument("--formats_mb", type=float, default=8.0, help="corpus size of 'formats'")
    args = parser.parse_args()
    work = pathlib.Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    demo = demo_corpus_path(work / "corpus")
    print(f"demo corpus: {demo.stat().st_size / 1e6:.2f} MB")
    start = time.perf_counter()
    sentences = (s for doc in read_documents([str(demo)], InputReport()) for s in doc)
    tokenizer = work / "tokenizer.model"
    train_tokenizer(sentences, TokenizerSettings(vocab_size=args.vocab_size), tokenizer)
    seconds = time.perf_counter() - start
    print(f"tokenizer training (vocab {args.vocab_size}, demo corpus): {seconds:.2f}s")

    if "formats" in args.sections:
        corpus = work / "corpus" / f"synthetic_{args.formats_mb:g}mb.txt"
        bench_formats(synthetic_corpus(demo, args.formats_mb, corpus), tokenizer, work)
    if "mixture" in args.sections:
        bench_mixture(work, tokenizer)
    if "prepare" not in args.sections:
        return
    corpora = [demo]
    if args.synthetic_mb > 0:
        synthetic = work / "corpus" / f"synthetic_{args.synthetic_mb:g}mb.txt"
        corpora.append(synthetic_corpus(demo, args.synthetic_mb, synthetic))
    for corpus in corpora:
        for workers in args.workers:
            bench_prepare(corpus, tokenizer, work / f"prepared_{corpus.stem}_{workers}", workers)

    loader_dir = work / f"prepared_{corpora[-1].stem}_{args.workers[0]}"
    for whole_word_masking in (False, True):
        bench_loader(loader_dir, whole_word_masking)


if __name__ == "__main__":
    main()
