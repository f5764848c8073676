"""Data pipeline throughput: tokenizer training, prepare (per worker, with peak RSS), loader;
preparation per shipped format; a mixture's loader against one source's.

    python -m benchmarks.data [--synthetic_mb 32] [--workers 1 2] [--work_dir runs/bench_data]
    python -m benchmarks.data --sections formats mixture [--formats_mb 8]

Uses the demo corpus (the interpreter's own documentation) and, with --synthetic_mb, a larger
corpus made by reshuffling its sentences into new documents. The loader is measured on one
core (no prefetch threads) at max_seq_length=128, batch_size=256, over --loader_batches
batches after a first one.

Section "formats" writes the same documents (a synthetic corpus of --formats_mb MB) as
google's text, JSON Lines in gzip and in zstd, and parquet, then prepares each with one worker:
MB/s (of document text) and tokens/s per core, and the reading alone (documents/s). Section
"mixture" prepares the three sources of bertjax.data.demo_sources (parquet, zstd and gzip JSON
Lines) with one tokenizer and times the three-source mixture's loader against one source's, in
alternating rounds of CPU time (benchmarks.harness.timing with the process's CPU clock) so that
both see the same machine.
"""

from __future__ import annotations

import os

# Loader throughput is a one-core figure: keep numpy's BLAS pools from spreading out (read
# when numpy is first imported, below).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import resource  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

from benchmarks.harness import report, timing  # noqa: E402
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


def once(function) -> tuple[float, Any]:
    """(seconds, result) of one call, by the harness's timer."""
    result = []
    seconds = timing.time_call(lambda: result.append(function()), rounds=1, warmup=0).median
    return seconds, result[0]


def bench_prepare(
    corpus: pathlib.Path, tokenizer: pathlib.Path, out: pathlib.Path, workers: int
) -> dict[str, float]:
    size_mb = corpus.stat().st_size / 1e6
    with TreeMemory() as memory:
        seconds, manifest = once(
            lambda: prepare(
                [str(corpus)],
                out,
                tokenizer_path=tokenizer,
                workers=workers,
                dupe_factor=1,
                max_seq_length=128,
                verbose=False,
            )
        )
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
    return {"MB/s per worker": size_mb / seconds / workers, "peak MB": memory.peak_total_mb}


def bench_loader(data_dir: pathlib.Path, whole_word_masking: bool, batches: int) -> float:
    loader = make_loader(
        data_dir,
        batch_size=256,
        seed=0,
        process_index=0,
        process_count=1,
        masking=MaskingSettings(whole_word_masking=whole_word_masking),
    )
    next(loader)  # the first batch opens the shards
    seconds, _ = once(lambda: [next(loader) for _ in range(batches)])
    rate = batches * 256 / seconds
    print(
        f"loader S=128 B=256 whole_word_masking={whole_word_masking}: "
        f"{rate:,.0f} masked sequences/s "
        f"({loader.num_examples} examples)"
    )
    return rate


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


def bench_formats(
    corpus: pathlib.Path, tokenizer: pathlib.Path, work: pathlib.Path
) -> dict[str, float]:
    files = write_formats(corpus, work / "formats")
    figures = {}
    for name, path in files.items():
        read_seconds, documents = once(
            lambda path=path: sum(1 for _ in read_documents([str(path)], InputReport()))
        )
        seconds, manifest = once(
            lambda path=path, name=name: prepare(
                [str(path)],
                work / f"prepared_format_{name}",
                tokenizer_path=tokenizer,
                workers=1,
                dupe_factor=1,
                max_seq_length=128,
                verbose=False,
            )
        )
        text_mb = manifest["raw_chars"] / 1e6
        tokens = sum(split["num_tokens"] for split in manifest["splits"].values())
        print(
            f"format {name:<9} file {path.stat().st_size / 1e6:6.2f} MB: read {documents} "
            f"documents in {read_seconds:.2f}s ({documents / read_seconds:,.0f} documents/s); "
            f"prepare (1 core) {seconds:.2f}s = {text_mb / seconds:.2f} MB/s of text, "
            f"{tokens / seconds:,.0f} tokens/s per core"
        )
        figures[f"{name} MB/s"] = text_mb / seconds
    return figures


def _side_by_side(label: str, single, mixture, rounds: int, batches: int = 60) -> float:
    """The single-source loader and the mixture's, timed in alternating rounds of CPU time
    (process time: other work on a shared machine does not count; the loader makes its
    batches in this thread). Returns the mixture's cost in percent."""

    def take(loader):
        return lambda: [next(loader) for _ in range(batches)]

    found = timing.time_rounds(
        {"single": take(single), "mixture": take(mixture)},
        rounds=rounds,
        clock=time.process_time,
    )
    one, three = (found[name].median / batches * 1e3 for name in ("single", "mixture"))
    cost = (three / one - 1) * 100
    print(
        f"loader S=128 B=256, one core, {label}: one source {1e3 / one:.0f} batches/s, "
        f"three-source mixture {1e3 / three:.0f} batches/s (CPU time, median of {rounds} "
        f"alternating rounds of {batches} batches): the mixture costs {cost:+.1f}%"
    )
    return cost


def bench_mixture(work: pathlib.Path, tokenizer: pathlib.Path, rounds: int) -> dict[str, float]:
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
    figures = {}
    figures["formats as three sources, cost %"] = _side_by_side(
        "the three formats' sources against their documents as one source",
        make_loader(whole, **kwargs),
        mixture,
        rounds,
    )
    # The mixture's own cost, apart from what its rows hold: the same prepared data as three
    # sources of 0.6 / 0.3 / 0.1.
    copies = [(dataclasses.replace(s, name=f"copy{i}"), whole) for i, (s, _) in enumerate(prepared)]
    figures["one source as three, cost %"] = _side_by_side(
        "the same data as one source and as three",
        make_loader(whole, **kwargs),
        make_mixture_loader(copies, **kwargs),
        rounds,
    )
    # The same again against one source of as many shards as the three copies have: a large
    # corpus is many shards, and a batch that spans several gathers from each (as here).
    sharded = work / "prepared_mix_whole_3_shards"
    prepare([str(demo)], sharded, verbose=False, chunk_mb=demo.stat().st_size / 3.2e6, **common)
    figures["three shards as three sources, cost %"] = _side_by_side(
        "the same data as one source of three shards and as three sources",
        make_loader(sharded, **kwargs),
        make_mixture_loader(copies, **kwargs),
        rounds,
    )
    print(
        "realised shares after the rounds: "
        + ", ".join(f"{k} {v:.4f}" for k, v in mixture.shares().items())
    )
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
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
    parser.add_argument("--mixture_rounds", type=int, default=31, help="rounds of 'mixture'")
    parser.add_argument("--loader_batches", type=int, default=200, help="batches timed")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    machine = report.start("data", argv)
    work = pathlib.Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    demo = demo_corpus_path(work / "corpus")
    print(f"demo corpus: {demo.stat().st_size / 1e6:.2f} MB")
    tokenizer = work / "tokenizer.model"

    def train() -> None:
        sentences = (s for doc in read_documents([str(demo)], InputReport()) for s in doc)
        train_tokenizer(sentences, TokenizerSettings(vocab_size=args.vocab_size), tokenizer)

    seconds, _ = once(train)
    print(f"tokenizer training (vocab {args.vocab_size}, demo corpus): {seconds:.2f}s")
    figures: dict[str, Any] = {"tokenizer training s": seconds}

    if "formats" in args.sections:
        corpus = work / "corpus" / f"synthetic_{args.formats_mb:g}mb.txt"
        corpus = synthetic_corpus(demo, args.formats_mb, corpus)
        figures["formats"] = bench_formats(corpus, tokenizer, work)
    if "mixture" in args.sections:
        figures["mixture"] = bench_mixture(work, tokenizer, args.mixture_rounds)
    if "prepare" in args.sections:
        corpora = [demo]
        if args.synthetic_mb > 0:
            synthetic = work / "corpus" / f"synthetic_{args.synthetic_mb:g}mb.txt"
            corpora.append(synthetic_corpus(demo, args.synthetic_mb, synthetic))
        for corpus in corpora:
            for workers in args.workers:
                out = work / f"prepared_{corpus.stem}_{workers}"
                figures[f"prepare {corpus.name} workers {workers}"] = bench_prepare(
                    corpus, tokenizer, out, workers
                )
        loader_dir = work / f"prepared_{corpora[-1].stem}_{args.workers[0]}"
        for whole_word_masking in (False, True):
            figures[f"loader sequences/s, whole_word_masking={whole_word_masking}"] = bench_loader(
                loader_dir, whole_word_masking, args.loader_batches
            )
    report.finish("data", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
