"""Six short fixed runs whose parameters two code versions must reproduce bit for bit.

    python benchmarks/refactor_check.py OUT

Pretrains the tiny BERT (configs/tiny.py) and the tiny ModernBERT (configs/modernbert_tiny.py)
with the masked LM, and the tiny ELECTRA (configs/electra_tiny.py) and ModernBERT
(configs/modernbert_rtd_tiny.py) with replaced-token detection, for 20 steps each on the
built-in demo corpus; fine-tunes the BERT run on a fixed sentiment CSV (classification) and
the ModernBERT run as a mean-pooled bi-encoder (embedding) for one epoch; then prints one
SHA-256 over every parameter leaf of each run's newest checkpoint (benchmarks/param_hashes.py).
A refactor that changes no number prints the same six lines before and after; about five to
eight minutes on two CPU cores.
"""

import csv
import os
import subprocess
import sys

import param_hashes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
FINETUNE = (
    "--config.num_epochs=1",
    "--config.batch_size=8",
    "--config.eval_batch_size=8",
    "--config.data.max_seq_length=32",
    "--config.model.hidden_dropout=0.1",
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


def run(*args: str) -> None:
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True)


def main() -> None:
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    bert, modern = os.path.join(out, "bert"), os.path.join(out, "modernbert")
    run("train.py", "--config", "configs/tiny.py", "--workdir", bert, *PRETRAIN)
    run(
        "train.py",
        *("--config", "configs/modernbert_tiny.py", "--workdir", modern),
        *PRETRAIN,
        "--config.data.max_seq_length=64",
        "--config.model.local_attention=16",
        "--config.optimizer.decay_steps=10",
        "--config.batch_warmup_start=4",
        "--config.batch_warmup_steps=10",
    )
    electra = os.path.join(out, "electra_rtd")
    run("train.py", "--config", "configs/electra_tiny.py", "--workdir", electra, *PRETRAIN)
    modern_rtd = os.path.join(out, "modernbert_rtd")
    run(
        "train.py",
        *("--config", "configs/modernbert_rtd_tiny.py", "--workdir", modern_rtd),
        *PRETRAIN,
        "--config.data.max_seq_length=64",
        "--config.model.local_attention=16",
        "--config.optimizer.decay_steps=10",
        "--config.batch_warmup_start=4",
        "--config.batch_warmup_steps=10",
    )
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    write_sentiment(os.path.join(data, "train.csv"), 64)
    write_sentiment(os.path.join(data, "dev.csv"), 16)
    write_pairs(os.path.join(data, "pairs.csv"), 64)
    write_pairs(os.path.join(data, "pairs_dev.csv"), 16)
    classify = os.path.join(out, "classify")
    run(
        "finetune.py",
        *("--workdir", classify, f"--config.init_from={bert}", "--config.task=classification"),
        f"--config.data.train={data}/train.csv",
        f"--config.data.validation={data}/dev.csv",
        *FINETUNE,
    )
    embed = os.path.join(out, "embed")
    run(
        "finetune.py",
        *("--workdir", embed, f"--config.init_from={modern}", "--config.task=embedding"),
        f"--config.data.train={data}/pairs.csv",
        f"--config.data.validation={data}/pairs_dev.csv",
        "--config.data.text_fields=anchor,positive",
        "--config.embedding.pooling=mean",
        *FINETUNE,
    )
    for workdir in (bert, modern, electra, modern_rtd, classify, embed):
        each, whole = param_hashes.digests(workdir)
        print(f"{os.path.basename(workdir)}: {len(each)} leaves, all {whole}")


if __name__ == "__main__":
    main()
