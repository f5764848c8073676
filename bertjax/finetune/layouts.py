"""How task files are laid out: the formats read, and the splits' names.

A `Layout` says how to find an example's texts, label and id in one file. Columns are named
by a header (CSV, TSV), by field (JSON Lines) or, in headerless TSV files such as CoLA's, by
position. CoNLL files hold one `token ... TAG` line per word and a blank line between
sentences.

GLUE's files are laid out in bertjax.finetune.glue_tasks.
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
# Distillation's examples without labels (config.data.unlabeled).
UNLABELED = "unlabeled"


def metric_prefix(split_name: str) -> str:
    """Metric namespace of a validation split: eval/, or eval_matched/ for MNLI's."""
    return "eval" + split_name[len(VALIDATION) :]


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
