"""Where each GLUE task's files are: GLUE's download layout, or the hub's parquet layout.

    locate(data_dir, task, cache_dir) -> TaskFiles | None   (None: the task is not there)

GLUE's download (`CoLA/train.tsv`, `SST-2/dev.tsv`, `MNLI/dev_matched.tsv`, ...) is what
fine-tuning reads (bertjax.finetune.glue_tasks.GLUE_TASKS), so such a directory is used as it
is. The hub's parquet layout of the GLUE dataset (`cola/train-00000-of-00001.parquet`,
`mnli/validation_matched-00000-of-00001.parquet`, ...) is converted once into that layout
under `cache_dir/<task>/`: its label ids become GLUE's labels (the hub's MNLI 0 is
"entailment"), its texts keep their words (a tab or line break inside one becomes a space,
since GLUE's files are unquoted TSV), its `idx` becomes the test files' index. A conversion
whose record (`source.json`) names the same parquet files and sizes is not done again.

Bad input fails in one line naming the file: a task directory without its dev file, a
parquet file that cannot be read or lacks a column, a label outside the task's set, an
empty text.
"""

from __future__ import annotations

import dataclasses
import json
import re

from bertjax.finetune import glue_tasks, layouts
from bertjax.finetune.data import NUMBER_LABEL, TEXT_LABEL, TaskDataError, read_split
from bertjax.finetune.glue_tasks import GlueTask
from bertjax.storage import fs

SOURCE_RECORD = "source.json"
HUB_LABEL = "label"
HUB_INDEX = "idx"
GLUE_EXTRA = "pip install 'bertjax[glue]'"


@dataclasses.dataclass(frozen=True)
class TaskFiles:
    """A task's files in GLUE's download layout."""

    task: GlueTask
    directory: str  # holds train.tsv, the dev file(s) and maybe the test file(s)
    tests: tuple[str, ...]  # the test splits present (test, or MNLI's two)


def _hub_file(directory: str, split: str) -> list[str]:
    """The parquet shards of a split: `<split>-00000-of-00002.parquet`, ... in order."""
    found = fs.glob(fs.join(directory, f"{split}-*.parquet"))
    pattern = re.compile(re.escape(split) + r"-\d+-of-\d+\.parquet$")
    return [p for p in found if pattern.search(p)]


def locate(data_dir: str, task: GlueTask, cache_dir: str) -> TaskFiles | None:
    """The task's files under data_dir in either layout (None when neither holds it)."""
    for name in dict.fromkeys((task.title, task.name)):
        candidate = fs.join(data_dir, name)
        if fs.kind(candidate) != "directory":
            continue
        if _hub_file(candidate, layouts.TRAIN) or _hub_file(candidate, "validation"):
            return _convert(candidate, task, fs.join(cache_dir, task.name))
        if any(fs.kind(fs.join(candidate, f)) == "file" for f in _download_names(task)):
            return _download(candidate, task)
    return None


def _download_names(task: GlueTask) -> list[str]:
    return [task.train.name, *(f.name for _, f in task.validation), *(f.name for _, f in task.test)]


def _download(directory: str, task: GlueTask) -> TaskFiles:
    for file in (task.train, *(f for _, f in task.validation)):
        if fs.kind(fs.join(directory, file.name)) != "file":
            needed = [task.train.name, *(f.name for _, f in task.validation)]
            raise TaskDataError(
                f"{directory}: no {file.name}; GLUE's {task.title} directory holds {needed} "
                "(and optionally its test file)"
            )
    tests = tuple(split for split, f in task.test if fs.kind(fs.join(directory, f.name)) == "file")
    return TaskFiles(task, directory, tests)


def check_labels(files: TaskFiles) -> None:
    """Reads a task's labelled files and fails at the first label outside the task's set,
    naming the file and line: done before a suite runs anything, so that a bad file is found
    before hours of other runs rather than after them."""
    task = files.task
    regression = task.task == glue_tasks.REGRESSION
    for split, file in (("train", task.train), *task.validation):
        path = fs.join(files.directory, file.name)
        label = NUMBER_LABEL if regression else TEXT_LABEL
        data = read_split(path, file.layout, split, True, label)
        if regression:
            continue
        for record in data.records:
            if record.label not in task.labels:
                raise TaskDataError(
                    f"{path} line {record.line}: label {record.label!r} is not one of "
                    f"{task.title}'s labels {list(task.labels)}"
                )


def _splits(task: GlueTask) -> list[tuple[str, glue_tasks.GlueFile, bool]]:
    """(hub split name, GLUE file, labelled) of each of the task's files."""
    return [
        (layouts.TRAIN, task.train, True),
        *((split, f, True) for split, f in task.validation),
        *((split, f, False) for split, f in task.test),
    ]


def _convert(directory: str, task: GlueTask, target: str) -> TaskFiles:
    """The hub's parquet files of a task, as GLUE's download layout under `target`."""
    present = {split: _hub_file(directory, split) for split, _, _ in _splits(task)}
    for split, _, labelled in _splits(task):
        if labelled and not present[split]:
            wanted = [s for s, _, needed in _splits(task) if needed]
            raise TaskDataError(
                f"{directory}: no {split}-*.parquet; the hub's {task.name} directory holds "
                f"{wanted} (and optionally test)"
            )
    record = {split: [[p, fs.size(p)] for p in paths] for split, paths in present.items() if paths}
    record_path = fs.join(target, SOURCE_RECORD)
    tests = tuple(split for split, _, labelled in _splits(task) if not labelled and present[split])
    files = TaskFiles(task, target, tests)
    if fs.kind(record_path) == "file" and json.loads(fs.path(record_path).read_text()) == record:
        return files  # converted before, from the same files
    fs.makedirs(target)
    for split, file, labelled in _splits(task):
        if present[split]:
            text = _tsv(task, present[split], file.layout, labelled, task.hub_text_columns)
            fs.write_text(fs.join(target, file.name), text)
    fs.write_text(record_path, json.dumps(record, indent=1) + "\n")
    return files


def read_parquet(path: str) -> dict[str, list]:
    """The columns of one parquet file; a file that cannot be read is named in one line."""
    try:
        import pyarrow.parquet as pq  # optional: only the hub's layout needs it
    except ImportError:
        raise TaskDataError(
            f"{path}: reading the hub's parquet files needs pyarrow; {GLUE_EXTRA}"
        ) from None
    try:
        with fs.path(path).open("rb") as f:
            return pq.read_table(f).to_pydict()
    except Exception as err:  # pyarrow's errors share no base class worth naming
        raise TaskDataError(f"{path}: not a readable parquet file ({err})") from None


def _columns(path: str, wanted: list[str]) -> dict[str, list]:
    columns = read_parquet(path)
    for column in wanted:
        if column not in columns:
            raise TaskDataError(f"{path}: no column {column!r}; it has {sorted(columns)}")
    return columns


def _clean(value, where: str, column: str) -> str:
    if not isinstance(value, str):
        raise TaskDataError(f"{where}: column {column!r} holds {value!r}, not text")
    text = " ".join(value.split())  # GLUE's TSV files are unquoted: no tabs or line breaks
    if not text:
        raise TaskDataError(f"{where}: the text in {column!r} is empty")
    return text


def _label(task: GlueTask, value, where: str) -> str:
    if task.hub_labels is None:  # regression: a number
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise TaskDataError(f"{where}: label {value!r} is not a number")
        return f"{float(value):.6g}"  # the hub's float32 3.8 is GLUE's 3.8
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (0 <= value < len(task.hub_labels))
    ):
        valid = ", ".join(f"{k} ({label})" for k, label in enumerate(task.hub_labels))
        raise TaskDataError(f"{where}: label {value!r} is not one of {task.title}'s labels {valid}")
    return task.hub_labels[value]


def _tsv(
    task: GlueTask,
    paths: list[str],
    layout: layouts.Layout,
    labelled: bool,
    text_columns: tuple[str, ...],
) -> str:
    """A split's parquet rows as the TSV file `layout` reads (by header, or by position in
    a headerless file such as CoLA's)."""
    names: list[str | int] = [layout.index_field] if layout.index_field else []
    names.extend(layout.text_fields)
    if labelled:
        names.append(layout.label_field)
    if layout.header:
        slot = {name: k for k, name in enumerate(names)}
        width = len(names)
    else:
        slot = {name: int(name) for name in names}
        width = max(slot.values()) + 1
    lines = ["\t".join(str(n) for n in names)] if layout.header else []
    wanted = [*text_columns, *([HUB_LABEL] if labelled else []), HUB_INDEX]
    for path in paths:
        columns = _columns(path, wanted)
        for row, index in enumerate(columns[HUB_INDEX]):
            where = f"{path} row {row}"
            fields = [""] * width
            if layout.index_field:
                fields[slot[layout.index_field]] = str(index)
            for field, column in zip(layout.text_fields, text_columns):
                fields[slot[field]] = _clean(columns[column][row], where, column)
            if labelled:
                fields[slot[layout.label_field]] = _label(task, columns[HUB_LABEL][row], where)
            lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"


def locate_ax(data_dir: str, cache_dir: str) -> str | None:
    """The diagnostic set (AX) as a TSV with index, sentence1, sentence2 columns, or None."""
    directory, name = glue_tasks.AX_DOWNLOAD_FILE
    download = fs.join(data_dir, directory, name)
    if fs.kind(download) == "file":
        return download
    hub = _hub_file(fs.join(data_dir, glue_tasks.AX_HUB_DIR), "test")
    if not hub:
        return None
    lines = ["index\tsentence1\tsentence2"]
    first, second = glue_tasks.GLUE_TASKS[glue_tasks.AX_MODEL].hub_text_columns
    for path in hub:
        columns = _columns(path, [first, second, HUB_INDEX])
        for row, index in enumerate(columns[HUB_INDEX]):
            where = f"{path} row {row}"
            a = _clean(columns[first][row], where, first)
            b = _clean(columns[second][row], where, second)
            lines.append(f"{index}\t{a}\t{b}")
    target = fs.join(cache_dir, glue_tasks.AX_HUB_DIR, name)
    fs.write_text(target, "\n".join(lines) + "\n")
    return target
