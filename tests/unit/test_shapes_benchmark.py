"""benchmarks.shapes: its length distributions and the programs-against-padding table."""

import numpy as np

from benchmarks import shapes


def test_squad_windows_are_cut_as_run_squad_cuts_them():
    lengths = shapes.squad_lengths(2000, np.random.default_rng(0))
    assert lengths.min() >= 6 + 20 + 3 and lengths.max() == 384  # long paragraphs fill windows
    assert 120 < np.median(lengths) < 200


def test_the_run_s_widths_compile_fewer_programs_for_a_little_padding():
    rows = shapes.main(["--shapes", "squad", "--overheads", "0"])
    by = {(row["shape"], row["policy"]): row for row in rows}
    before, after = by["squad", "every bucket"], by["squad", "finetune.py's default"]
    assert after["train_programs"] < before["train_programs"]
    assert after["eval_programs"] < before["eval_programs"] / 2
    # Positions: within the overheads (+2 % training, +5 % evaluation) of each bucket's.
    for phase, overhead in (("train", 0.02), ("eval", 0.05)):
        ratio = (1 - before[f"{phase}_padding"]) / (1 - after[f"{phase}_padding"])
        # (Each bucket cut a batch to its own longest; the widths hold each example's.)
        assert 1.0 <= ratio <= 1 + overhead + 0.01
    zero = by["squad", "fewest widths +0 %"]
    assert zero["train_padding"] == before["train_padding"]  # every bucket: the same batches
