"""Data pipeline throughput: tokenizer training, prepare (per worker, with peak RSS), loader.

    python benchmarks/data.py [--synthetic_mb 32] [--workers 1 2] [--work_dir runs/bench_data]

Uses the demo corpus (the interpreter's own documentation) and, with --synthetic_mb, a larger
corpus made by reshuffling its sentences into new documents. The loader is measured on one
core (no prefetch threads) at max_seq_length=128, batch_size=256.
"""

from __future__ import annotations

import argparse
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

from bertjax.data import MaskingSettings, demo_corpus_path, make_loader, prepare  # noqa: E402
from bertjax.data.corpus import InputReport, read_documents  # noqa: E402
from bertjax.tokenizer import TokenizerSettings, train_tokenizer  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", default="runs/bench_data")
    parser.add_argument(
        "--synthetic_mb", type=float, default=32.0, help="0 to skip the larger corpus"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab_size", type=int, default=8000)
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
