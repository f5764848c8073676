"""How task files are laid out: the formats read, and the standard GLUE TSV files.

A `Layout` says how to find an example's texts, label and id in one file. Columns are named
by a header (CSV, TSV), by field (JSON Lines) or, in headerless TSV files such as CoLA's, by
position. CoNLL files hold one `token ... TAG` line per word and a blank line between
sentences.

`GLUE_TASKS` holds, for each GLUE task, the files of the standard download (train.tsv,
dev.tsv, test.tsv; MNLI's matched and mismatched dev and test sets), their columns, the
task's labels and the metric the GLUE papers report for it.
"""

from __future__ import annotations

import dataclasses

CSV = "csv"
TSV = "tsv"
JSONL = "jsonl"
CONLL = "conll"
FORMATS = (CSV, TSV, JSONL, CONLL)
# The format a file's extension implies when config.data.format is empty.
EXTENSIONS = {".csv": CSV, ".tsv": TSV, ".jsonl": JSONL, ".json": JSONL, ".conll": CONLL}

TRAIN = "train"
VALIDATION = "validation"
TEST = "test"


# GLUE's tasks are label tasks (bertjax.tasks.labels), given by their registered names: this
# module sits below the task packages, which read their files with it (a test checks the names).
CLASSIFICATION = "classification"
REGRESSION = "regression"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one file keeps an example's parts."""

    format: str
    text_fields: tuple[str | int, ...] = ()  # one text, or a pair; unused by CoNLL
    label_field: str | int | None = None  # None: the file has no labels
    index_field: str | None = None  # a column of example ids; None: the row number
    header: bool = True  # CSV/TSV: the first row names the columns
    label_separator: str = ""  # multi-label: splits a label string into labels
    # Rows with too few fields are skipped and counted instead of failing: GLUE's QQP has
    # a few such rows, which every GLUE reader skips.
    skip_malformed: bool = False


@dataclasses.dataclass(frozen=True)
class GlueFile:
    """One file of a GLUE task: its name in the task's directory and its layout."""

    name: str
    layout: Layout


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """A GLUE task: its files, labels and the metric reported for it."""

    task: str  # CLASSIFICATION or REGRESSION
    labels: tuple[str, ...]  # in output order (regression: the one output's name)
    metric: str  # the GLUE papers' metric; the best checkpoint is kept by it
    train: GlueFile
    validation: tuple[tuple[str, GlueFile], ...]  # (split name, file)
    test: tuple[tuple[str, GlueFile], ...]


def _task(
    task: str,
    labels: tuple[str, ...],
    metric: str,
    texts: tuple[str, ...],
    label: str,
    *,
    index: str = "index",
    matched: bool = False,
    skip_malformed: bool = False,
) -> GlueTask:
    """A GLUE task whose files all have headers naming the columns."""
    labelled = Layout(TSV, texts, label, skip_malformed=skip_malformed)
    unlabelled = Layout(TSV, texts, None, index_field=index, skip_malformed=skip_malformed)
    if matched:  # MNLI: a matched and a mismatched set of each
        validation = tuple(
            (f"{VALIDATION}_{kind}", GlueFile(f"dev_{kind}.tsv", labelled))
            for kind in ("matched", "mismatched")
        )
        test = tuple(
            (f"{TEST}_{kind}", GlueFile(f"test_{kind}.tsv", unlabelled))
            for kind in ("matched", "mismatched")
        )
    else:
        validation = ((VALIDATION, GlueFile("dev.tsv", labelled)),)
        test = ((TEST, GlueFile("test.tsv", unlabelled)),)
    return GlueTask(task, labels, metric, GlueFile("train.tsv", labelled), validation, test)


BINARY = ("0", "1")
ENTAILMENT = ("entailment", "not_entailment")
PAIR = ("sentence1", "sentence2")

# CoLA's train and dev files have no header: source, label, original label, sentence.
_COLA_LABELLED = Layout(TSV, (3,), 1, header=False)

GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(
        CLASSIFICATION,
        BINARY,
        "mcc",
        GlueFile("train.tsv", _COLA_LABELLED),
        ((VALIDATION, GlueFile("dev.tsv", _COLA_LABELLED)),),
        ((TEST, GlueFile("test.tsv", Layout(TSV, ("sentence",), None, index_field="index"))),),
    ),
    "sst2": _task(CLASSIFICATION, BINARY, "accuracy", ("sentence",), "label"),
    "mrpc": _task(CLASSIFICATION, BINARY, "f1", ("#1 String", "#2 String"), "Quality"),
    # BERT's paper reports Spearman's correlation for STS-B.
    "stsb": _task(REGRESSION, ("score",), "spearman", PAIR, "score"),
    "qqp": _task(
        CLASSIFICATION,
        BINARY,
        "f1",
        ("question1", "question2"),
        "is_duplicate",
        index="id",
        skip_malformed=True,
    ),
    "mnli": _task(
        CLASSIFICATION,
        ("contradiction", "entailment", "neutral"),
        "accuracy",
        PAIR,
        "gold_label",
        matched=True,
    ),
    "qnli": _task(CLASSIFICATION, ENTAILMENT, "accuracy", ("question", "sentence"), "label"),
    "rte": _task(CLASSIFICATION, ENTAILMENT, "accuracy", PAIR, "label"),
    "wnli": _task(CLASSIFICATION, BINARY, "accuracy", PAIR, "label"),
}
# The names of the GLUE download's directories, accepted too: "SST-2" is "sst2".
GLUE_ALIASES = {"sst-2": "sst2", "sts-b": "stsb"}


def glue_task(name: str) -> GlueTask | None:
    """The GLUE task of a name as written in configs or directory names (case-insensitive)."""
    key = name.lower()
    return GLUE_TASKS.get(GLUE_ALIASES.get(key, key))
