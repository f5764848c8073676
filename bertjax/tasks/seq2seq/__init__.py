"""Translation and text generation: a warm-started BERT encoder-decoder.

model.py     the encoder-decoder, its loss, cached greedy and beam search, TaskOptions
task.py      the fine-tuning task (config.task=seq2seq, config.seq2seq) and the warm start
             from a BERT checkpoint (bert2bert, bertshare, bert2rnd, rnd2rnd)
metrics.py   corpus BLEU (sacrebleu) and ROUGE (rouge-score)
hf.py        transformers' EncoderDecoderModel in and out
generate.py  Model.generate
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from bertjax import capability
from bertjax.capability import HeadSpec, Opened
from bertjax.storage import fs

# Aliased: this package's own submodule is named hf.
from bertjax.storage import hf as hf_files
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from bertjax.tasks.seq2seq import model as seq2seq_lib
from bertjax.tasks.seq2seq.generate import generate
from bertjax.tasks.seq2seq.task import Seq2SeqTask, warm_start
from bertjax.text.tokenizer import load_tokenizer


class Seq2Seq(capability.Capability):
    """An encoder-decoder: BERT's encoder and a decoder with cross-attention."""

    tasks = (seq2seq_lib.TASK,)
    method = "generate"
    usage = 'generate(["a source text", ...])'
    fine_tuning = {seq2seq_lib.TASK: Seq2SeqTask()}
    notebook = {"generate": generate}

    def check_head(self, head: HeadSpec) -> None:
        if head.labels or not isinstance(head.options, seq2seq_lib.TaskOptions):
            raise ValueError(
                f"a {head.task} head has no labels and TaskOptions; got labels="
                f"{head.labels!r}, options={head.options!r}"
            )

    def options_from_dict(self, d: Mapping[str, Any]) -> seq2seq_lib.TaskOptions:
        return seq2seq_lib.TaskOptions.from_dict(dict(d))

    def head_from_legacy(self, task: str, labels: tuple[str, ...]) -> HeadSpec:
        return seq2seq_lib.TaskOptions.from_labels(labels).head()

    def init(self, config, head: HeadSpec):
        return seq2seq_lib.task_init(config, head)

    def warm_start(self, config, head, source, params, fresh) -> tuple[Any, str, bool]:
        params, note = warm_start(head.options, config, source, params, fresh)
        return params, note, False

    def recognises(self, path: str | os.PathLike) -> bool:
        """A transformers EncoderDecoderModel directory (its config.json says)."""
        config = fs.path(path) / hf_files.CONFIG_NAME
        if fs.kind(config) != "file":
            return False
        try:
            return json.loads(fs.read_text(config)).get("model_type") == "encoder-decoder"
        except fs.StorageError:
            raise
        except (OSError, ValueError, AttributeError):
            return False

    def open(self, path: str | os.PathLike, **overrides) -> Opened:
        config, params = seq2seq_hf.load_seq2seq(path, **overrides)
        tokenizer = load_tokenizer(path)
        options = seq2seq_lib.TaskOptions(
            decoder_start_id=config.decoder_start_id, eos_id=config.eos_id, init=config.init
        )
        return Opened(config.bert, params, tokenizer, options.head())

    def save(self, model, directory: str | os.PathLike) -> None:
        config = model.head.options.config(model.config)
        seq2seq_hf.save_seq2seq(config, model.params, directory, tokenizer=model.tokenizer)


CAPABILITY = Seq2Seq()
