"""The GLUE benchmark's tasks as the papers report them: names, directories, metrics, files.

Each `BenchmarkTask` adds to fine-tuning's GLUE task (bertjax.finetune.layouts.GLUE_TASKS:
its files, labels and the metric its best epoch is kept by) what a benchmark run needs:

- where it lives in GLUE's download (`CoLA/`, `SST-2/`, ...) and in the hub's parquet layout
  of the GLUE dataset (`cola/train-00000-of-00001.parquet`, ...), and the hub's columns and
  label ids;
- the metrics the papers report (Matthews for CoLA, F1 and accuracy for MRPC and QQP, Pearson
  and Spearman for STS-B, matched and mismatched accuracy for MNLI, accuracy elsewhere), by
  the keys a fine-tuning run's result.json holds them under;
- the files of a leaderboard submission (`CoLA.tsv`, `MNLI-m.tsv`, ...).

WNLI runs only when asked for (every paper leaves it out), and AX, the diagnostic set, is
predicted by MNLI's model for a submission only.
"""

from __future__ import annotations

import dataclasses

from bertjax.finetune import layouts


@dataclasses.dataclass(frozen=True)
class Metric:
    """One reported metric of a task."""

    name: str  # "mcc", "f1", "accuracy", "pearson", "spearman"
    key: str  # the key in a fine-tuning run's scores: "eval/mcc", "eval_matched/accuracy"
    label: str  # the column's heading: "MCC", "F1", "Acc", "m Acc"


@dataclasses.dataclass(frozen=True)
class BenchmarkTask:
    """A GLUE task as the benchmark runs and reports it."""

    name: str  # its key in finetune.layouts.GLUE_TASKS, and the config's name for it
    title: str  # as the papers write it: "CoLA", "SST-2"
    download_dir: str  # its directory in GLUE's download
    hub_dir: str  # its directory in the hub's parquet layout
    metrics: tuple[Metric, ...]  # as the papers report them; the task's score is their mean
    # The hub's text columns, in the order of the GLUE layout's text fields.
    hub_columns: tuple[str, ...]
    # GLUE's label (as its TSV files write it) of each of the hub's label ids; None: a
    # regression task, whose labels are numbers.
    hub_labels: tuple[str, ...] | None
    # (test split, the submission file its predictions go to).
    submission: tuple[tuple[str, str], ...]
    by_default: bool = True  # WNLI: only when asked for
    in_average: bool = True  # WNLI: the papers' average leaves it out

    @property
    def glue(self) -> layouts.GlueTask:
        """Fine-tuning's description of the task's files, labels and kept metric."""
        return layouts.GLUE_TASKS[self.name]

    @property
    def selection_key(self) -> str:
        """The score a configuration is chosen by: the metric fine-tuning keeps the best
        epoch by, on the first validation split (MNLI: matched)."""
        first = self.glue.validation[0][0]
        return "eval" + first[len(layouts.VALIDATION) :] + "/" + self.glue.metric


def _one(name: str, prefix: str = "eval") -> Metric:
    labels = {"mcc": "MCC", "f1": "F1", "accuracy": "Acc", "pearson": "Pearson"}
    return Metric(name, f"{prefix}/{name}", labels.get(name, name.capitalize()))


BINARY_HUB = ("0", "1")  # the hub's 0/1 ids are GLUE's "0"/"1"
NLI_HUB = ("entailment", "not_entailment")
MNLI_HUB = ("entailment", "neutral", "contradiction")  # the hub's ids 0, 1, 2
PAIR = ("sentence1", "sentence2")

TASKS: tuple[BenchmarkTask, ...] = (
    BenchmarkTask(
        "cola", "CoLA", "CoLA", "cola", (_one("mcc"),), ("sentence",), BINARY_HUB,
        (("test", "CoLA.tsv"),),
    ),
    BenchmarkTask(
        "sst2", "SST-2", "SST-2", "sst2", (_one("accuracy"),), ("sentence",), BINARY_HUB,
        (("test", "SST-2.tsv"),),
    ),
    BenchmarkTask(
        "mrpc", "MRPC", "MRPC", "mrpc", (_one("f1"), _one("accuracy")), PAIR, BINARY_HUB,
        (("test", "MRPC.tsv"),),
    ),
    BenchmarkTask(
        "stsb", "STS-B", "STS-B", "stsb", (_one("pearson"), _one("spearman")), PAIR, None,
        (("test", "STS-B.tsv"),),
    ),
    BenchmarkTask(
        "qqp", "QQP", "QQP", "qqp", (_one("f1"), _one("accuracy")), ("question1", "question2"),
        BINARY_HUB, (("test", "QQP.tsv"),),
    ),
    BenchmarkTask(
        "mnli", "MNLI", "MNLI", "mnli",
        (
            Metric("matched_accuracy", "eval_matched/accuracy", "m Acc"),
            Metric("mismatched_accuracy", "eval_mismatched/accuracy", "mm Acc"),
        ),
        ("premise", "hypothesis"), MNLI_HUB,
        (("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv")),
    ),
    BenchmarkTask(
        "qnli", "QNLI", "QNLI", "qnli", (_one("accuracy"),), ("question", "sentence"), NLI_HUB,
        (("test", "QNLI.tsv"),),
    ),
    BenchmarkTask(
        "rte", "RTE", "RTE", "rte", (_one("accuracy"),), PAIR, NLI_HUB, (("test", "RTE.tsv"),),
    ),
    BenchmarkTask(
        "wnli", "WNLI", "WNLI", "wnli", (_one("accuracy"),), PAIR, BINARY_HUB,
        (("test", "WNLI.tsv"),), by_default=False, in_average=False,
    ),
)  # fmt: skip
BY_NAME = {task.name: task for task in TASKS}
DEFAULT_TASKS = tuple(task.name for task in TASKS if task.by_default)

# The diagnostic set (AX): MNLI's labels, predicted by MNLI's model for a submission.
AX_MODEL = "mnli"
AX_DOWNLOAD_FILE = ("diagnostic", "diagnostic.tsv")  # (directory, file) in GLUE's download
AX_HUB_DIR = "ax"
AX_HUB_COLUMNS = ("premise", "hypothesis")
AX_SUBMISSION = "AX.tsv"


def get(name: str) -> BenchmarkTask:
    """The task of a name as configs or GLUE's directories write it ("SST-2", "sst2");
    ValueError naming the valid ones otherwise."""
    key = name.strip().lower()
    key = layouts.GLUE_ALIASES.get(key, key)
    if key not in BY_NAME:
        raise ValueError(f"{name!r} is not a GLUE task; the tasks are {list(BY_NAME)}")
    return BY_NAME[key]


def parse_names(text: str | tuple | list) -> tuple[str, ...]:
    """Task names from "cola,sst2" or a list, each once, in the table's order."""
    names = text.split(",") if isinstance(text, str) else list(text)
    wanted = {get(n).name for n in names if str(n).strip()}
    return tuple(task.name for task in TASKS if task.name in wanted)
