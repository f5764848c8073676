"""GLUE's tasks, one table: what fine-tuning reads of each and what the benchmark reports.

For each task: the files of GLUE's download (train.tsv, dev.tsv, test.tsv; MNLI's matched and
mismatched dev and test sets) and their columns, the task's labels and the metric its best
epoch is kept by (config.data.glue_task reads a task's files through them); its title as the
papers write it, which names its directory in GLUE's download; the metrics the papers report
(Matthews for CoLA, F1 and accuracy for MRPC and QQP, Pearson and Spearman for STS-B, matched
and mismatched accuracy for MNLI, accuracy elsewhere), by the keys a fine-tuning run's
result.json holds them under; where the hub's parquet layout of the GLUE dataset differs
(its text columns, the order of its label ids); and the leaderboard's submission files
(`CoLA.tsv`, `MNLI-m.tsv`, ...). bertjax.glue runs and reports the suite from it.

WNLI runs only when asked for (every paper leaves it out), and AX, the diagnostic set, is
predicted by MNLI's model for a submission only.
"""

from __future__ import annotations

import dataclasses

from bertjax.finetune.layouts import TEST, TSV, VALIDATION, Layout, metric_prefix

# GLUE's tasks are label tasks (bertjax.tasks.labels), given by their registered names: this
# module sits below the task packages, which read their files with it (a test checks the names).
CLASSIFICATION = "classification"
REGRESSION = "regression"

# MNLI's two dev and test sets, and how the papers and the leaderboard abbreviate them.
MNLI_SETS = {"matched": "m", "mismatched": "mm"}
# A reported metric's heading in the results table.
_METRIC_HEADINGS = {"mcc": "MCC", "f1": "F1", "accuracy": "Acc", "pearson": "Pearson"}


@dataclasses.dataclass(frozen=True)
class GlueFile:
    """One file of a GLUE task: its name in the task's directory and its layout."""

    name: str
    layout: Layout


@dataclasses.dataclass(frozen=True)
class Metric:
    """One reported metric of a task."""

    name: str  # "mcc", "f1", "accuracy", "pearson", "spearman", "matched_accuracy"
    key: str  # the key in a fine-tuning run's scores: "eval/mcc", "eval_matched/accuracy"
    label: str  # the column's heading: "MCC", "F1", "Acc", "m Acc"


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """A GLUE task: its files, labels and kept metric, and how the benchmark reports it."""

    name: str  # config.data.glue_task's name for it, and its directory in the hub's layout
    title: str  # as the papers write it ("SST-2"), and its directory in GLUE's download
    task: str  # CLASSIFICATION or REGRESSION
    labels: tuple[str, ...]  # in output order (regression: the one output's name)
    metric: str  # the GLUE papers' metric; the best checkpoint is kept by it
    train: GlueFile
    validation: tuple[tuple[str, GlueFile], ...]  # (split name, file)
    test: tuple[tuple[str, GlueFile], ...]
    # The metrics the papers report, on each validation split; the task's score is their mean.
    reported: tuple[str, ...]
    # The hub's text columns where they are not the TSV files' (in the text fields' order).
    hub_columns: tuple[str, ...] = ()
    # The label of each of the hub's label ids where they are not in `labels`' order.
    hub_label_order: tuple[str, ...] = ()
    by_default: bool = True  # WNLI: only when asked for
    in_average: bool = True  # WNLI: the papers' average leaves it out

    @property
    def hub_text_columns(self) -> tuple[str, ...]:
        """The hub's text columns, in the order of the TSV layout's text fields."""
        return self.hub_columns or tuple(self.train.layout.text_fields)

    @property
    def hub_labels(self) -> tuple[str, ...] | None:
        """GLUE's label (as its TSV files write it) of each of the hub's label ids; None: a
        regression task, whose labels are numbers."""
        if self.task == REGRESSION:
            return None
        return self.hub_label_order or self.labels

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """The reported metrics, each on each validation split (MNLI: matched, mismatched)."""
        out = []
        for split, _ in self.validation:
            kind = split[len(VALIDATION) + 1 :]  # "matched", or "" for the one dev set
            for name in self.reported:
                heading = _METRIC_HEADINGS.get(name, name.capitalize())
                out.append(
                    Metric(
                        f"{kind}_{name}" if kind else name,
                        f"{metric_prefix(split)}/{name}",
                        f"{MNLI_SETS[kind]} {heading}" if kind else heading,
                    )
                )
        return tuple(out)

    @property
    def submission(self) -> tuple[tuple[str, str], ...]:
        """(test split, the leaderboard file its predictions go to): `CoLA.tsv`, `MNLI-m.tsv`."""
        out = []
        for split, _ in self.test:
            kind = split[len(TEST) + 1 :]
            out.append(
                (split, f"{self.title}-{MNLI_SETS[kind]}.tsv" if kind else f"{self.title}.tsv")
            )
        return tuple(out)

    @property
    def selection_key(self) -> str:
        """The score a configuration is chosen by: the metric fine-tuning keeps the best
        epoch by, on the first validation split (MNLI: matched)."""
        return f"{metric_prefix(self.validation[0][0])}/{self.metric}"


def _task(
    name: str,
    title: str,
    task: str,
    labels: tuple[str, ...],
    metric: str,
    texts: tuple[str, ...],
    label: str,
    *,
    reported: tuple[str, ...] = (),
    index: str = "index",
    matched: bool = False,
    skip_malformed: bool = False,
    **benchmark,
) -> GlueTask:
    """A GLUE task whose files all have headers naming the columns (`reported`: default the
    kept metric alone)."""
    labelled = Layout(TSV, texts, label, skip_malformed=skip_malformed)
    unlabelled = Layout(TSV, texts, None, index_field=index, skip_malformed=skip_malformed)
    if matched:  # MNLI: a matched and a mismatched set of each
        validation = tuple(
            (f"{VALIDATION}_{kind}", GlueFile(f"dev_{kind}.tsv", labelled)) for kind in MNLI_SETS
        )
        test = tuple(
            (f"{TEST}_{kind}", GlueFile(f"test_{kind}.tsv", unlabelled)) for kind in MNLI_SETS
        )
    else:
        validation = ((VALIDATION, GlueFile("dev.tsv", labelled)),)
        test = ((TEST, GlueFile("test.tsv", unlabelled)),)
    train = GlueFile("train.tsv", labelled)
    return GlueTask(
        name,
        title,
        task,
        labels,
        metric,
        train,
        validation,
        test,
        reported or (metric,),
        **benchmark,
    )


BINARY = ("0", "1")
ENTAILMENT = ("entailment", "not_entailment")
PAIR = ("sentence1", "sentence2")

# CoLA's train and dev files have no header: source, label, original label, sentence.
_COLA_LABELLED = Layout(TSV, (3,), 1, header=False)

GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask(
            "cola",
            "CoLA",
            CLASSIFICATION,
            BINARY,
            "mcc",
            GlueFile("train.tsv", _COLA_LABELLED),
            ((VALIDATION, GlueFile("dev.tsv", _COLA_LABELLED)),),
            ((TEST, GlueFile("test.tsv", Layout(TSV, ("sentence",), None, index_field="index"))),),
            reported=("mcc",),
            hub_columns=("sentence",),
        ),
        _task("sst2", "SST-2", CLASSIFICATION, BINARY, "accuracy", ("sentence",), "label"),
        _task(
            "mrpc",
            "MRPC",
            CLASSIFICATION,
            BINARY,
            "f1",
            ("#1 String", "#2 String"),
            "Quality",
            reported=("f1", "accuracy"),
            hub_columns=PAIR,
        ),
        # BERT's paper reports Spearman's correlation for STS-B.
        _task(
            "stsb",
            "STS-B",
            REGRESSION,
            ("score",),
            "spearman",
            PAIR,
            "score",
            reported=("pearson", "spearman"),
        ),
        _task(
            "qqp",
            "QQP",
            CLASSIFICATION,
            BINARY,
            "f1",
            ("question1", "question2"),
            "is_duplicate",
            reported=("f1", "accuracy"),
            index="id",
            skip_malformed=True,
        ),
        _task(
            "mnli",
            "MNLI",
            CLASSIFICATION,
            ("contradiction", "entailment", "neutral"),
            "accuracy",
            PAIR,
            "gold_label",
            matched=True,
            hub_columns=("premise", "hypothesis"),
            hub_label_order=("entailment", "neutral", "contradiction"),  # the hub's ids 0, 1, 2
        ),
        _task(
            "qnli",
            "QNLI",
            CLASSIFICATION,
            ENTAILMENT,
            "accuracy",
            ("question", "sentence"),
            "label",
        ),
        _task("rte", "RTE", CLASSIFICATION, ENTAILMENT, "accuracy", PAIR, "label"),
        _task(
            "wnli",
            "WNLI",
            CLASSIFICATION,
            BINARY,
            "accuracy",
            PAIR,
            "label",
            by_default=False,
            in_average=False,
        ),
    )
}
DEFAULT_TASKS = tuple(name for name, task in GLUE_TASKS.items() if task.by_default)

# The diagnostic set (AX): MNLI's labels, predicted by MNLI's model for a submission; its
# file has the columns of MNLI's test files, the hub's those of MNLI's.
AX_MODEL = "mnli"
AX_DOWNLOAD_FILE = ("diagnostic", "diagnostic.tsv")  # (directory, file) in GLUE's download
AX_HUB_DIR = "ax"
AX_SUBMISSION = "AX.tsv"


def glue_task(name: str) -> GlueTask | None:
    """The GLUE task of a name as configs or GLUE's directories write it ("SST-2", "sst2";
    case-insensitive), or None."""
    key = name.lower()
    for task in GLUE_TASKS.values():
        if key in (task.name, task.title.lower()):
            return task
    return None


def get(name: str) -> GlueTask:
    """The GLUE task of a name (as `glue_task`); ValueError naming the valid ones otherwise."""
    task = glue_task(name.strip())
    if task is None:
        raise ValueError(f"{name!r} is not a GLUE task; the tasks are {list(GLUE_TASKS)}")
    return task


def parse_names(text: str | tuple | list) -> tuple[str, ...]:
    """Task names from "cola,sst2" or a list, each once, in the table's order."""
    names = text.split(",") if isinstance(text, str) else list(text)
    wanted = {get(n).name for n in names if str(n).strip()}
    return tuple(name for name in GLUE_TASKS if name in wanted)
