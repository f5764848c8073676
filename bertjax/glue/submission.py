"""A GLUE leaderboard submission: each task's chosen run predicts its test file.

    write(report, workdir, data_dir, cache_dir, located) -> {"zip", "files", "missing"}

The run that stands for a task (bertjax.glue.results.median_run: the best configuration's
median seed) predicts the task's test file(s) through the notebook API
(`bertjax.Model.load(run).predict`), and MNLI's also predicts the diagnostic set (AX). Each
file is what the GLUE server reads: a header `index<TAB>prediction`, then each test
example's index and its predicted label as GLUE spells it ("entailment", "0", ...; STS-B a
number), under the server's file names (CoLA.tsv, MNLI-m.tsv, MNLI-mm.tsv, AX.tsv, ...),
zipped into submission.zip.
"""

from __future__ import annotations

import io
import warnings
import zipfile

from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir
from bertjax.finetune import glue_tasks, layouts
from bertjax.finetune.data import read_split
from bertjax.glue import files as files_lib
from bertjax.glue import results as results_lib
from bertjax.inference import Model
from bertjax.storage import fs
from bertjax.text.features import TruncationWarning

SUBMISSION_DIR = "submission"
SUBMISSION_ZIP = "submission.zip"
# AX's file has the columns of MNLI's test files.
AX_LAYOUT = glue_tasks.GLUE_TASKS[glue_tasks.AX_MODEL].test[0][1].layout


def prediction_lines(model: Model, path: str, layout: layouts.Layout, max_length: int) -> str:
    """A submission file's text: the header, then each example's index and prediction."""
    records = read_split(path, layout, layouts.TEST, require_labels=False).records
    texts = [r.texts[0] for r in records]
    pairs = [r.texts[1] for r in records] if len(records[0].texts) == 2 else None
    with warnings.catch_warnings():
        # Long inputs are cut as fine-tuning cut them (google's run_classifier does too).
        warnings.simplefilter("ignore", TruncationWarning)
        predictions = model.predict(texts, pairs, max_length=max_length)
    lines = ["index\tprediction"]
    for record, prediction in zip(records, predictions):
        if model.head.task == glue_tasks.REGRESSION:
            value = f"{prediction['score']:.3f}"
        else:
            value = prediction["label"]
        lines.append(f"{record.index}\t{value}")
    return "\n".join(lines) + "\n"


def _model(run_dir: fs.AnyPath) -> tuple[Model, int]:
    """A run's best parameters, and the max_seq_length it was fine-tuned with."""
    meta = checkpoint_lib.read_meta(run_dir / rundir.BEST_CHECKPOINT_DIR)
    return Model.load(run_dir, progress=False), int(meta["max_seq_length"])


def write(report: dict, workdir, data_dir: str, cache_dir: str, located: dict) -> dict:
    """The submission's files and zip in workdir (see the module docstring)."""
    workdir = fs.path(workdir)
    out = workdir / SUBMISSION_DIR
    written: dict[str, str] = {}
    missing = []
    for name, entry in report["tasks"].items():
        task = glue_tasks.GLUE_TASKS[name]
        run_dir = workdir / results_lib.median_run(entry)
        model, max_length = _model(run_dir)
        tests = dict(task.test)
        for split, filename in task.submission:
            if split not in located[name].tests:
                missing.append(filename)
                continue
            path = fs.join(located[name].directory, tests[split].name)
            written[filename] = prediction_lines(model, path, tests[split].layout, max_length)
        if name == glue_tasks.AX_MODEL:
            ax = files_lib.locate_ax(data_dir, cache_dir)
            if ax is None:
                missing.append(glue_tasks.AX_SUBMISSION)
            else:
                written[glue_tasks.AX_SUBMISSION] = prediction_lines(
                    model, ax, AX_LAYOUT, max_length
                )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for filename, text in written.items():
            archive.writestr(filename, text)
            fs.write_text(out / filename, text)
    fs.write_bytes(workdir / SUBMISSION_ZIP, buffer.getvalue())
    if missing:
        print(f"submission: no test file for {', '.join(missing)}; left out", flush=True)
    return {"zip": str(workdir / SUBMISSION_ZIP), "files": sorted(written), "missing": missing}
