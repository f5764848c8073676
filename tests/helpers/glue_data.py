"""Small GLUE-shaped data for every task, in GLUE's download layout and the hub's parquet one.

Texts are sentences of the synthetic corpus's topic words (so the tiny pretrained tokenizer
knows them); each label follows from the texts' topics, so a model can learn it:

- one-sentence tasks (CoLA, SST-2): "1" for an even topic, "0" for an odd one;
- pair tasks: "1" / "entailment" when both sentences share a topic's parity; MNLI's three
  labels by the difference of the two topics modulo 3; STS-B's score 4.5 for the same topic,
  0.5 plus the parity match otherwise.

Headers and label spellings are written here by hand, as GLUE's files and the hub's parquet
files have them, independently of bertjax.glue's table.
"""

from __future__ import annotations

import pathlib
import random

import pyarrow as pa
import pyarrow.parquet as pq

MNLI_LABELS = ("contradiction", "entailment", "neutral")  # by (topic a - topic b) % 3
HUB_MNLI = {"entailment": 0, "neutral": 1, "contradiction": 2}
HUB_NLI = {"entailment": 0, "not_entailment": 1}

# (directory in GLUE's download, hub directory, pair?, dev files, test files)
TASKS = {
    "cola": ("CoLA", "cola"),
    "sst2": ("SST-2", "sst2"),
    "mrpc": ("MRPC", "mrpc"),
    "stsb": ("STS-B", "stsb"),
    "qqp": ("QQP", "qqp"),
    "mnli": ("MNLI", "mnli"),
    "qnli": ("QNLI", "qnli"),
    "rte": ("RTE", "rte"),
    "wnli": ("WNLI", "wnli"),
}
PAIRS = {"mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}


def _sentence(rng: random.Random, words: list[str]) -> str:
    return " ".join(rng.choice(words) for _ in range(rng.randint(3, 6))) + " ."


def _label(task: str, a: int, b: int | None):
    if b is None:
        return "1" if a % 2 == 0 else "0"
    same = a % 2 == b % 2
    if task == "mnli":
        return MNLI_LABELS[(a - b) % 3]
    if task == "stsb":
        return 4.5 if a == b else 0.5 + same
    if task in ("qnli", "rte"):
        return "entailment" if same else "not_entailment"
    return "1" if same else "0"


def examples(task: str, topics: dict[int, list[str]], count: int, seed: int) -> list[tuple]:
    """(index, text a, text b or None, label) rows of a task."""
    rng = random.Random(f"{task}-{seed}")
    rows = []
    for k in range(count):
        a = rng.randrange(len(topics))
        b = rng.randrange(len(topics)) if task in PAIRS else None
        if task == "stsb" and rng.random() < 0.3:
            b = a
        text_b = _sentence(rng, topics[b]) if b is not None else None
        rows.append((k, _sentence(rng, topics[a]), text_b, _label(task, a, b)))
    return rows


def _download_lines(task: str, rows: list[tuple], labelled: bool) -> list[str]:
    """A file of GLUE's download, with its real header (CoLA's labelled files have none)."""
    if task == "cola":
        if labelled:
            return [f"gj04\t{label}\t\t{a}" for _, a, _, label in rows]
        return ["index\tsentence"] + [f"{i}\t{a}" for i, a, _, _ in rows]
    if task == "sst2":
        if labelled:
            return ["sentence\tlabel"] + [f"{a}\t{label}" for _, a, _, label in rows]
        return ["index\tsentence"] + [f"{i}\t{a}" for i, a, _, _ in rows]
    if task == "mrpc":
        if labelled:
            head = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
            return [head] + [f"{label}\t{i}\t{i + 1}\t{a}\t{b}" for i, a, b, label in rows]
        head = "index\t#1 ID\t#2 ID\t#1 String\t#2 String"
        return [head] + [f"{i}\t{i}\t{i + 1}\t{a}\t{b}" for i, a, b, _ in rows]
    if task == "stsb":
        head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
        if labelled:
            return [head + "\tscore"] + [
                f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{label}" for i, a, b, label in rows
            ]
        return [head] + [f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}" for i, a, b, _ in rows]
    if task == "qqp":
        if labelled:
            head = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
            return [head] + [f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{lab}" for i, a, b, lab in rows]
        return ["id\tquestion1\tquestion2"] + [f"{i}\t{a}\t{b}" for i, a, b, _ in rows]
    if task == "mnli":
        if labelled:
            head = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label"
            return [head] + [
                f"{i}\t1\t{i}e\tfiction\t{a}\t{b}\t{lab}\t{lab}" for i, a, b, lab in rows
            ]
        head = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2"
        return [head] + [f"{i}\t1\t{i}e\tfiction\t{a}\t{b}" for i, a, b, _ in rows]
    first, second = ("question", "sentence") if task == "qnli" else ("sentence1", "sentence2")
    if labelled:
        return [f"index\t{first}\t{second}\tlabel"] + [
            f"{i}\t{a}\t{b}\t{label}" for i, a, b, label in rows
        ]
    return [f"index\t{first}\t{second}"] + [f"{i}\t{a}\t{b}" for i, a, b, _ in rows]


def _splits(task: str) -> tuple[list[str], list[str]]:
    """The dev and test split names (MNLI's matched and mismatched)."""
    if task == "mnli":
        return ["dev_matched", "dev_mismatched"], ["test_matched", "test_mismatched"]
    return ["dev"], ["test"]


def write_download(
    root: pathlib.Path, topics, tasks=tuple(TASKS), train=64, dev=32, test=16, ax=True
) -> pathlib.Path:
    """GLUE's download layout under root (CoLA/train.tsv, ..., diagnostic/diagnostic.tsv)."""
    for task in tasks:
        directory = root / TASKS[task][0]
        directory.mkdir(parents=True, exist_ok=True)
        dev_names, test_names = _splits(task)
        files = [("train", train, True, 1)]
        files += [(name, dev, True, 2 + k) for k, name in enumerate(dev_names)]
        files += [(name, test, False, 10 + k) for k, name in enumerate(test_names)]
        for name, count, labelled, seed in files:
            rows = examples(task, topics, count, seed)
            text = "\n".join(_download_lines(task, rows, labelled)) + "\n"
            (directory / f"{name}.tsv").write_text(text)
    if ax:
        rows = examples("mnli", topics, test, 20)
        (root / "diagnostic").mkdir(parents=True, exist_ok=True)
        lines = ["index\tsentence1\tsentence2"] + [f"{i}\t{a}\t{b}" for i, a, b, _ in rows]
        (root / "diagnostic" / "diagnostic.tsv").write_text("\n".join(lines) + "\n")
    return root


# The hub's text columns and how its label ids are written.
HUB_COLUMNS = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}


def _hub_label(task: str, label):
    if task == "stsb":
        return float(label)
    if task == "mnli":
        return HUB_MNLI[label]
    if task in ("qnli", "rte"):
        return HUB_NLI[label]
    return int(label)


def write_parquet(path: pathlib.Path, columns: dict[str, list]) -> None:
    """One parquet file of the given columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def write_hub(
    root: pathlib.Path, topics, tasks=tuple(TASKS), train=64, dev=32, test=16, ax=True
) -> pathlib.Path:
    """The hub's parquet layout under root (cola/train-00000-of-00001.parquet, ...)."""
    for task in tasks:
        directory = root / TASKS[task][1]
        dev_names, test_names = _splits(task)
        files = [("train", train, True, 1)]
        files += [
            (name.replace("dev", "validation"), dev, True, 2 + k)
            for k, name in enumerate(dev_names)
        ]
        files += [(name, test, False, 10 + k) for k, name in enumerate(test_names)]
        for name, count, labelled, seed in files:
            rows = examples(task, topics, count, seed)
            first, *second = HUB_COLUMNS[task]
            columns = {first: [a for _, a, _, _ in rows]}
            if second:
                columns[second[0]] = [b for _, _, b, _ in rows]
            no_label = -1.0 if task == "stsb" else -1
            columns["label"] = [_hub_label(task, lab) if labelled else no_label for *_, lab in rows]
            columns["idx"] = [i for i, *_ in rows]
            write_parquet(directory / f"{name}-00000-of-00001.parquet", columns)
    if ax:
        rows = examples("mnli", topics, test, 20)
        write_parquet(
            root / "ax" / "test-00000-of-00001.parquet",
            {
                "premise": [a for _, a, _, _ in rows],
                "hypothesis": [b for _, _, b, _ in rows],
                "label": [-1] * len(rows),
                "idx": [i for i, *_ in rows],
            },
        )
    return root


def gold(task: str, topics, count: int = 32, split: int = 0) -> list:
    """The labels of a task's dev file (split: MNLI's 0 matched, 1 mismatched)."""
    return [label for *_, label in examples(task, topics, count, 2 + split)]
