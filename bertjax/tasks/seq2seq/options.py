"""What a fine-tuned encoder-decoder is beyond its BERT architecture (TaskOptions), and its
parameters' initialisation for a fine-tuning run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.tasks.seq2seq.decoding import GenerationSettings
from bertjax.tasks.seq2seq.model import (
    BERT2BERT,
    INITS,
    TASK,
    Seq2SeqConfig,
    Seq2SeqModel,
    stored_params,
)


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What a fine-tuned encoder-decoder is beyond its BERT architecture: the init, the
    special ids, the training loss and how evaluation generates.

    A fine-tuning run keeps them in its checkpoints' head (`head` / `from_head`: the
    HeadSpec's typed options), so the run directory reopens on its own and a resumed run
    checks that they did not change.
    """

    decoder_start_id: int
    eos_id: int
    init: str = BERT2BERT
    label_smoothing: float = 0.0
    max_target_length: int = 64
    generation: GenerationSettings = GenerationSettings()

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing={self.label_smoothing!r} is invalid: must be in [0, 1)"
            )
        if self.max_target_length < 2:
            raise ValueError(
                f"max_target_length={self.max_target_length!r} is invalid: must be >= 2 "
                "(a token and [SEP])"
            )
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r} is invalid: must be one of {INITS}")

    def config(self, bert: BertConfig) -> Seq2SeqConfig:
        """The encoder-decoder over `bert` (its layers unrolled, as the decoder needs)."""
        # The decoder is BERT's layers with cross-attention.
        if getattr(bert, "family", None) != BertConfig.family:
            raise ValueError(f"seq2seq needs a BERT encoder; {type(bert).__name__} is not one")
        return Seq2SeqConfig(
            dataclasses.replace(bert, scan_layers=False),
            decoder_start_id=self.decoder_start_id,
            eos_id=self.eos_id,
            init=self.init,
        )

    def head(self) -> HeadSpec:
        """The HeadSpec a fine-tuning run's checkpoints carry."""
        return HeadSpec(TASK, (), self)

    @classmethod
    def from_head(cls, head: HeadSpec) -> TaskOptions:
        """Inverse of `head`."""
        if head.task != TASK:
            raise ValueError(f"head task={head.task!r} is not {TASK!r}")
        return head.options

    @classmethod
    def from_dict(cls, d: dict) -> TaskOptions:
        """Inverse of dataclasses.asdict (the form a checkpoint's meta stores)."""
        return cls(**{**d, "generation": GenerationSettings(**d["generation"])})

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> TaskOptions:
        """The options of a head written before they were typed: name=value labels."""
        values = dict(label.split("=", 1) for label in labels)
        generation = GenerationSettings(
            max_new_tokens=int(values["max_new_tokens"]),
            num_beams=int(values["num_beams"]),
            length_penalty=float(values["length_penalty"]),
            no_repeat_ngram_size=int(values["no_repeat_ngram_size"]),
        )
        return cls(
            decoder_start_id=int(values["decoder_start_id"]),
            eos_id=int(values["eos_id"]),
            init=values["init"],
            label_smoothing=float(values["label_smoothing"]),
            max_target_length=int(values["max_target_length"]),
            generation=generation,
        )


def task_init(bert: BertConfig, head: HeadSpec):
    """`rng -> boxed stored parameters` of a fine-tuning run's encoder-decoder (fresh: the
    run's warm start replaces them), for bertjax.engine.steps.make_state."""
    config = TaskOptions.from_head(head).config(bert)

    def init(rng: jax.Array) -> dict:
        ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
        fresh = Seq2SeqModel(config).init({"params": rng}, ids, None, None, ids)["params"]
        return stored_params(config, fresh)

    return init
