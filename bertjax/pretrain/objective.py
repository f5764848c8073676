"""What a pretraining step minimises, and its steps.

The masked LM plus the sentence-pair task (next-sentence or sentence-order prediction, as
the data's labels say), or the masked LM alone. `build_pretraining` gives the engine
(bertjax.steps.build) the encoder family's pretraining model's parameters and
`PretrainingObjective`; the loss is normalised as google-research/bert's.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bertjax import encoders, losses, sharding, steps
from bertjax.pretrain.settings import PretrainSettings


class PretrainingObjective(steps.Objective):
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


def build_pretraining(settings: PretrainSettings, model_config: Any, devices=None) -> steps.Steps:
    """Creates the mesh, shardings and jitted functions of a run (nothing is allocated)."""
    run, data = settings.run, settings.data
    mesh = sharding.make_mesh(run.mesh_shape, devices=devices)
    family = encoders.family_of(model_config)
    return steps.build(
        PretrainingObjective(
            family.pretraining_model(model_config), sentence_pair=settings.sentence_pair
        ),
        family.pretraining_init(model_config),
        settings.optimizer,
        mesh,
        grad_accum_steps=run.grad_accum_steps,
        packed_length=steps.packed_length(
            run.micro_batch_size, data.max_seq_length, run.token_capacity, mesh
        ),
    )
