"""Six short fixed runs whose parameters two code versions must reproduce bit for bit.

    python -m benchmarks.refactor_check OUT

Pretrains the tiny BERT (configs/tiny.py), the tiny ModernBERT (configs/modernbert_tiny.py),
the tiny ELECTRA (configs/electra_tiny.py, replaced-token detection) and the tiny ModernBERT
by replaced-token detection (configs/modernbert_rtd_tiny.py) for 20 steps each on the
built-in demo corpus, fine-tunes the BERT run on a fixed sentiment CSV (classification) and
the ModernBERT run as a mean-pooled bi-encoder (embedding) for one epoch, then prints one
line per run: its parameter leaves and one SHA-256 over all of them (benchmarks.param_hashes),
in the order bert, modernbert, electra_rtd, modernbert_rtd, classify, embed. A refactor that
changes no number prints the same six lines before and after; a few minutes on two CPU cores.
"""

import argparse
import csv
import os

from benchmarks import param_hashes
from benchmarks.harness import commands

PRETRAIN = (
    "--config.num_train_steps=20",
    "--config.batch_size=8",
    "--config.eval_every_steps=20",
    "--config.eval_batches=2",
    "--config.log_every_steps=10",
    "--config.checkpoint_every_steps=20",
    "--config.data.dupe_factor=1",
    "--config.data.vocab_size=1000",
    "--config.optimizer.warmup_steps=5",
)
# ModernBERT's tiny recipes, shortened to the same 20 steps.
MODERN = (
    "--config.data.max_seq_length=64",
    "--config.model.local_attention=16",
    "--config.optimizer.decay_steps=10",
    "--config.batch_warmup_start=4",
    "--config.batch_warmup_steps=10",
)
FINETUNE = (
    "--config.num_epochs=1",
    "--config.batch_size=8",
    "--config.eval_batch_size=8",
    "--config.data.max_seq_length=32",
    "--config.model.hidden_dropout=0.1",
)
# (run name, config file, the recipe's extra flags)
PRETRAINING_RUNS = (
    ("bert", "configs/tiny.py", ()),
    ("modernbert", "configs/modernbert_tiny.py", MODERN),
    ("electra_rtd", "configs/electra_tiny.py", ()),
    ("modernbert_rtd", "configs/modernbert_rtd_tiny.py", MODERN),
)

WORDS = ("good", "great", "fine", "bad", "awful", "poor")


def write_sentiment(path: str, rows: int) -> None:
    """A fixed two-label CSV: the label is whether the first word is a good one."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["sentence", "label"])
        for i in range(rows):
            first, second = WORDS[i % 6], WORDS[(i * 5 + 1) % 6]
            out.writerow([f"the film was {first} and the cast {second} {i}", int(i % 6 < 3)])


def write_pairs(path: str, rows: int) -> None:
    """Fixed anchor/positive pairs for the bi-encoder."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["anchor", "positive", "label"])
        for i in range(rows):
            word = WORDS[i % 6]
            out.writerow([f"a {word} film {i}", f"the film was {word}", (i % 6) / 5])


def main(argv: list[str] | None = None) -> list[str]:
    """Runs the six and prints (and returns) their lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the directory the runs are written to")
    out = os.path.abspath(parser.parse_args(argv).out)
    os.makedirs(out, exist_ok=True)
    runs = {}
    for name, config, extra in PRETRAINING_RUNS:
        runs[name] = os.path.join(out, name)
        commands.run(
            commands.script(
                "train.py", "--config", config, "--workdir", runs[name], *PRETRAIN, *extra
            )
        )
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    write_sentiment(os.path.join(data, "train.csv"), 64)
    write_sentiment(os.path.join(data, "dev.csv"), 16)
    write_pairs(os.path.join(data, "pairs.csv"), 64)
    write_pairs(os.path.join(data, "pairs_dev.csv"), 16)
    runs["classify"] = os.path.join(out, "classify")
    commands.run(
        commands.script(
            "finetune.py",
            *("--workdir", runs["classify"], f"--config.init_from={runs['bert']}"),
            "--config.task=classification",
            f"--config.data.train={data}/train.csv",
            f"--config.data.validation={data}/dev.csv",
            *FINETUNE,
        )
    )
    runs["embed"] = os.path.join(out, "embed")
    commands.run(
        commands.script(
            "finetune.py",
            *("--workdir", runs["embed"], f"--config.init_from={runs['modernbert']}"),
            "--config.task=embedding",
            f"--config.data.train={data}/pairs.csv",
            f"--config.data.validation={data}/pairs_dev.csv",
            "--config.data.text_fields=anchor,positive",
            "--config.embedding.pooling=mean",
            *FINETUNE,
        )
    )
    lines = [param_hashes.line(name, workdir) for name, workdir in runs.items()]
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
