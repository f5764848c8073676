"""benchmarks.harness: the one timer (with a clock the test drives), the JSON row every
benchmark ends with, and the fixtures' inputs."""

import argparse
import itertools
import json
import pathlib

import numpy as np
import pytest

import benchmarks
from benchmarks.harness import commands, fixtures, report, timing
from bertjax.capability import ENCODER
from bertjax.encoders.bert.config import BertConfig
from bertjax.finetune import summary as summary_lib
from bertjax.finetune import warm_start


class FakeClock:
    """A clock that moves only when a timed call says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def takes(self, seconds: float):
        """A side whose every call lasts the next of `seconds` (cycled)."""
        durations = itertools.cycle(seconds)

        def call():
            self.now += next(durations)
            return "out"

        return call


def test_warm_up_calls_are_kept_apart_and_rounds_interleave_the_sides():
    clock, order, waited = FakeClock(), [], []
    durations = {"ours": [5.0, 1.0, 3.0, 2.0], "theirs": [9.0, 4.0, 8.0, 6.0]}
    sides = {}
    for name, seconds in durations.items():
        step = clock.takes(seconds)
        sides[name] = lambda step=step, name=name: (order.append(name), step())[1]
    rounds = []
    found = timing.time_rounds(
        sides,
        rounds=3,
        warmup=1,
        wait=waited.append,
        clock=clock,
        on_round=lambda index, seconds: rounds.append((index, seconds)),
    )
    assert order == ["ours", "theirs", "ours", "theirs", "ours", "theirs", "ours", "theirs"]
    assert waited == ["out"] * 8  # every output waited for inside its own timing
    ours, theirs = found["ours"], found["theirs"]
    assert ours.warmup == (5.0,) and ours.rounds == (1.0, 3.0, 2.0)
    assert theirs.warmup == (9.0,) and theirs.rounds == (4.0, 8.0, 6.0)
    assert ours.median == 2.0 and ours.spread == (1.0, 3.0) and ours.first == 5.0
    assert ours.rate(10) == 5.0
    assert rounds == [(0, {"ours": 1.0, "theirs": 4.0}), (1, {"ours": 3.0, "theirs": 8.0})] + [
        (2, {"ours": 2.0, "theirs": 6.0})
    ]
    # Within each round theirs / ours: 4, 8/3, 3; the median of those, not of the medians.
    assert timing.ratio(theirs, ours) == 3.0
    assert ours.figures() == {
        "median_s": 2.0,
        "min_s": 1.0,
        "max_s": 3.0,
        "rounds": 3,
        "first_s": 5.0,
    }


def test_one_side_without_warm_up_and_with_cpu_time():
    clock, cpu = FakeClock(), FakeClock()

    def call():
        clock.now += 2.0
        cpu.now += 1.5

    found = timing.time_call(call, name="x", rounds=2, warmup=0, clock=clock, cpu_clock=cpu)
    assert found.rounds == (2.0, 2.0) and found.warmup == () and found.first is None
    assert found.cpu == (1.5, 1.5) and found.figures()["cpu_s"] == 1.5
    # A side warmed up by the caller takes no warm-up call here; the other takes its own.
    both = timing.time_rounds(
        {"a": call, "b": call}, rounds=1, warmup={"a": 0, "b": 2}, clock=clock
    )
    assert both["a"].warmup == () and both["b"].warmup == (2.0, 2.0)


def test_the_timer_refuses_what_it_cannot_time():
    with pytest.raises(ValueError, match="rounds=0 must be >= 1"):
        timing.time_call(lambda: None, rounds=0)
    with pytest.raises(ValueError, match=r"warmup=\{'a': 1\} >= 0 for each of \['a', 'b'\]"):
        timing.time_rounds({"a": lambda: None, "b": lambda: None}, warmup={"a": 1})
    a = timing.Timing("a", (1.0, 2.0))
    b = timing.Timing("b", (1.0,))
    with pytest.raises(ValueError, match="'a' has 2 rounds and 'b' 1"):
        timing.ratio(a, b)


def test_the_row_names_the_benchmark_its_parameters_the_host_and_the_figures(tmp_path, capsys):
    args = argparse.Namespace(rounds=2, lengths=(8, 16), path=tmp_path, json=str(tmp_path / "r"))
    figures = {"tokens_per_sec": np.float32(1.5), "ratio": 2.0}
    first = report.finish("train", args, figures)
    second = report.finish("train", args, {"ratio": 3.0})
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(report.ROW_PREFIX) and json.loads(line[len(report.ROW_PREFIX) :])
    assert report.read_rows(args.json) == [first, second]  # appended, one line per run
    assert first["benchmark"] == "train"
    assert first["params"] == {"rounds": 2, "lengths": [8, 16], "path": str(tmp_path)}
    assert first["figures"] == {"tokens_per_sec": 1.5, "ratio": 2.0}
    host = first["host"]
    assert host["backend"] == "cpu" and host["device_count"] >= 1 and host["cores"] >= 1
    assert host["device_kind"] and {"python", "jax", "numpy"} <= set(host["versions"])
    assert set(host["cpu_flags"]) <= set(report.CPU_FLAGS)
    assert "host: " in report.describe(host) and "jax " in report.describe(host)


def test_random_parameters_fill_the_pretraining_tree():
    config = BertConfig.preset("tiny", vocab_size=64)
    params = fixtures.random_params(config, seed=1)
    again = fixtures.random_params(config, seed=1)
    assert set(params) >= {ENCODER} and len(params) > 1  # the heads too
    scale = params[ENCODER]["embeddings"]["layer_norm"]["scale"]
    kernels = [
        leaf for path, leaf in _leaves(params) if path.endswith("kernel") and leaf.size > 1000
    ]
    assert abs(float(scale.mean()) - 1.0) < 0.02 and 0.04 < float(kernels[0].std()) < 0.06
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(_leaves(params), _leaves(again)))


def _leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", np.asarray(value)


def test_pretraining_batches_mask_real_tokens_only():
    rng = np.random.default_rng(0)
    batch = fixtures.pretraining_batch(rng, 16, 64, 6, 100, shortest=20, full_share=0.9)
    lengths = batch["input_mask"].sum(axis=1)
    assert lengths[0] < 64 and lengths.min() >= 20 and (lengths == 64).sum() >= 8
    picked = np.take_along_axis(batch["input_mask"], batch["masked_lm_positions"], axis=1)
    assert picked.all() and (batch["masked_lm_positions"] > 0).all()  # never [CLS]
    assert batch["input_ids"][batch["input_mask"] > 0].min() >= fixtures.FIRST_REAL_ID
    with pytest.raises(ValueError, match="shortest=4 must lie in"):
        fixtures.pretraining_batch(rng, 2, 64, 6, 100, shortest=4)


def test_sentence_pairs_and_lengths():
    rng = np.random.default_rng(0)
    features, starts = fixtures.sentence_pairs(rng, 8, 32, (2, 5), (3, 9), 50)
    ids, mask, segments = features["input_ids"], features["input_mask"], features["segment_ids"]
    for row in range(8):
        n = int(mask[row].sum())
        assert ids[row, 0] == fixtures.CLS_ID and ids[row, n - 1] == fixtures.SEP_ID
        assert ids[row, starts[row] - 1] == fixtures.SEP_ID and 4 <= starts[row] <= 7
        assert segments[row, : starts[row]].sum() == 0 and segments[row, starts[row] : n].all()
    lengths = fixtures.quantile_lengths("reviews", 4000, rng)
    assert lengths.min() >= 8 and lengths.max() <= 461 and 95 < np.median(lengths) < 117
    with pytest.raises(ValueError, match="unknown lengths 'x'"):
        fixtures.quantile_lengths("x", 1, rng)


def test_a_random_bert_directory_opens_with_its_word_vocabulary(tmp_path):
    config = BertConfig.preset("tiny", vocab_size=40)
    fixtures.random_bert_directory(tmp_path, config, seed=0)
    source = warm_start.open_source(str(tmp_path))
    assert source.config.vocab_size == 40 and source.config.num_layers == config.num_layers
    ids = source.tokenizer.encode_batch(["w0 w7 w34"])[0]
    assert ids == [fixtures.FIRST_REAL_ID, fixtures.FIRST_REAL_ID + 7, 39]


def test_finetune_py_s_summary_line_is_read_back(capsys):
    summary = {
        "seeds": [{"seed": 0, "workdir": "runs/x", "best": None}],
        "preempted": False,
        "wall_time_sec": 95.4,
        "compile_sec": 85.1,
        "programs_compiled": 29,
        "programs_loaded": 2,
        "usage": "answer(...)",
    }
    summary_lib.print_summary(summary)
    out = capsys.readouterr().out + "\neval/f1 12.5\neval/f1 20.25\n"
    assert commands.finetune_summary(out) == commands.FinetuneSummary(95.4, 85.1, 29, 2)
    assert commands.finetune_summary("no summary") is None
    assert commands.last_metric(out, "eval/f1") == 20.25
    assert commands.last_metric(out, "dev F1") is None


def test_the_benchmarks_import_the_library_and_each_other_as_packages():
    """No benchmark reaches into sys.path: `python -m benchmarks.<name>` from the root imports
    bertjax and benchmarks.<module> as packages."""
    root = pathlib.Path(benchmarks.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10
    assert [f.name for f in files if "sys.path" in f.read_text()] == []
