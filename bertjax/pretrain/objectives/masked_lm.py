"""The masked language model, with or without the sentence-pair task: what `mlm_sentence` and
`mlm` share (the loss normalised as google-research/bert's, the unigram baseline, the
fill-mask samples)."""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bertjax.data import baseline
from bertjax.engine import perf, steps
from bertjax.nn import losses
from bertjax.pretrain import samples
from bertjax.pretrain.objectives.base import PretrainObjective


class MaskedLmLoss(steps.Loss):
    """Masked LM (+ the sentence-pair task), normalised as google-research/bert does.

    `model` is an encoder family's pretraining model (EncoderFamily.pretraining_model). With
    `sentence_pair=False` the loss is the masked LM's alone: a pair head's logits are still
    computed (BERT's parameter tree stays BertForPreTraining's) but get no gradient, and the
    metrics have no nsp_* entries.
    """

    def __init__(self, model: nn.Module, sentence_pair: bool = True):
        self.model = model
        self.sentence_pair = sentence_pair

    def sums(self, params, batch, *, rng, deterministic, packed_length=None):
        output = self.model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=deterministic,
            packed_length=packed_length,
            # Rows of packed documents (data.layout="packed"); absent from sentence pairs.
            document_ids=batch.get("document_ids"),
            positions=batch.get("positions"),
            rngs={"dropout": rng} if rng is not None else {},
        )
        return losses.loss_sums(output.mlm_logits, output.nsp_logits, batch)

    def zero_sums(self):
        return losses.LossSums(*(jnp.zeros((), jnp.float32) for _ in losses.LossSums._fields))

    def denominators(self, batch):
        mlm_denominator = jnp.sum(batch["masked_lm_weights"])
        nsp_denominator = jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)
        return mlm_denominator, nsp_denominator

    def loss(self, sums, denominators):
        if self.sentence_pair:
            return losses.total_loss(sums, *denominators)
        return losses.masked_lm_loss(sums, denominators[0])

    def metrics(self, sums, prefix):
        return losses.metrics(sums, prefix, sentence_pair=self.sentence_pair)


class MaskedLanguageModel(PretrainObjective):
    """The masked LM (+ the sentence-pair task when `sentence_pair`) on a family's
    pretraining model."""

    samples_title = "Fill-mask on held-out text (top 3):"

    def check(self, values, family: Any, layout: str) -> None:
        """Nothing beyond what every objective checks; the subclasses add theirs."""

    def step(self, family: Any, model_config: Any, settings: Any) -> steps.Loss:
        return MaskedLmLoss(
            family.pretraining_model(model_config), sentence_pair=self.sentence_pair
        )

    def baselines(
        self, settings: Any, data_dir: str | os.PathLike, eval_metrics: dict | None = None
    ) -> dict[str, float]:
        """The unigram guess's MLM accuracy (and the commonest pair label's), on the eval
        batches the run evaluates."""
        batches = {
            "batch_size": settings.run.micro_batch_size,
            "max_batches": settings.run.eval_batches,
        }
        unigram = baseline.unigram_baseline(
            data_dir, masking=settings.data.eval_masking, seed=settings.run.seed, **batches
        )
        out = {"eval/mlm_accuracy": unigram.accuracy}
        if self.sentence_pair:
            out["eval/nsp_accuracy"] = baseline.sentence_pair_baseline(data_dir, **batches)
        return out

    def flops(self, family, model_config, seq_len: int, predictions: int, options=None) -> float:
        # The family's pair head is counted whether trained or not: it is computed either way.
        return perf.training_flops_per_sequence(
            model_config,
            seq_len,
            predictions,
            feed_forward_matrices=family.feed_forward_matrices,
            sentence_pair_head=family.sentence_pair_head,
        )

    def samples(
        self, model_config, params, tokenizer, data_dir, count, mesh, options=None
    ) -> list[str]:
        """The model's fill-mask guesses for a word hidden in held-out sentences."""
        texts = samples.held_out_texts(data_dir, tokenizer, count)
        return samples.fill_mask_samples(model_config, params, tokenizer, texts, mesh=mesh)
