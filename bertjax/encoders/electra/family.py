"""ELECTRA as an encoder family: the interface the capabilities use (bertjax.encoders.family).

An ELECTRA pretrains with replaced-token detection (objective "rtd",
bertjax.pretrain.objectives.rtd) from a preset (ElectraConfig.preset). Transformers' ELECTRA
directories open (Model.load, fine-tuning's init_from), every capability but seq2seq runs on
them, and they travel back.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import flax.linen as nn
import numpy as np

from bertjax.encoders import family
from bertjax.encoders.electra import generator as generator_lib
from bertjax.encoders.electra import hf as electra_hf
from bertjax.encoders.electra import model as electra_model
from bertjax.encoders.electra import rtd as electra_rtd
from bertjax.encoders.electra.config import ARCHITECTURE_FIELDS, ElectraConfig
from bertjax.storage import hf


class Electra(family.EncoderFamily):
    name = "electra"
    # google-research/electra fine-tunes at its model config's 0.1 (BertConfig's defaults,
    # which configure_finetuning does not override).
    finetune_dropout = MappingProxyType({"hidden_dropout": 0.1, "attention_dropout": 0.1})
    config_class = ElectraConfig
    model_type = electra_hf.MODEL_TYPE
    sentence_pair_head = False
    architecture_fields = ARCHITECTURE_FIELDS
    replaced_token_head = electra_model.DISCRIMINATOR_HEAD
    replaced_token_frozen = electra_rtd.FROZEN

    def config_to_dict(self, config: ElectraConfig) -> dict:
        return config.to_dict()

    def config_from_dict(self, d: Mapping[str, Any]) -> ElectraConfig:
        return ElectraConfig.from_dict(dict(d))

    def from_settings(self, preset: str, fields: Mapping[str, Any]) -> ElectraConfig:
        # BERT's names for dropout and attention are ELECTRA's own fields.
        return ElectraConfig.preset(preset, **fields)

    def with_vocabulary(self, config: ElectraConfig, tokenizer: Any) -> ElectraConfig:
        return dataclasses.replace(config, vocab_size=tokenizer.vocab_size)

    def with_overrides(self, config: ElectraConfig, overrides: Mapping[str, Any]):
        """BERT's names are ELECTRA's own fields (hidden_dropout, attention_dropout, dtype,
        attention_impl, remat_policy)."""
        return dataclasses.replace(config, **overrides)

    def describe(self, config: ElectraConfig) -> str:
        shape = f"L{config.num_layers}/H{config.hidden_size}/A{config.num_heads}"
        return f"ELECTRA {shape}/E{config.embedding_size}"

    def module(self, config: ElectraConfig, name: str | None = None) -> nn.Module:
        return electra_model.ElectraEncoder(config, name=name)

    def head(self, config: ElectraConfig, name: str, outputs: int, reads: str) -> family.Head:
        """transformers' ELECTRA heads: a sequence head is ElectraClassificationHead, dropout
        -> dense -> GELU -> dropout -> out_proj on [CLS], whose first three steps the encoder
        computes as its pooled output (its dense layer is "pooler" in every ELECTRA tree) and
        whose last two the module does; a token head is dropout -> dense. The dropout rate
        is classifier_rate, as in ElectraForTokenClassification."""
        init = nn.initializers.truncated_normal(config.initializer_range)
        return family.Head(
            reads,
            config.classifier_rate,
            family.projection(config, outputs, name, init),
            electra_hf.head_tensors(config, name, outputs, reads),
        )

    def pretraining_model(self, config: ElectraConfig) -> electra_model.ElectraPreTraining:
        return electra_model.ElectraPreTraining(config)

    def pretraining_init(self, config: ElectraConfig):
        return electra_model.pretraining_init(config)

    def pretrained_networks(self, config: ElectraConfig, params: Any) -> dict:
        """A replaced-token detection run holds the discriminator and, under "generator", the
        generator (bertjax.encoders.electra.generator): each opens as an ElectraPreTraining,
        the head it never trained freshly made."""
        if not generator_lib.has_generator(params):
            return {"": family.Network(config, params)}
        generator_config, generator = generator_lib.generator(config, params)
        return {
            "": _network(config, generator_lib.discriminator(params), electra_model.MLM_HEAD),
            generator_lib.GENERATOR: _network(
                generator_config, generator, electra_model.DISCRIMINATOR_HEAD
            ),
        }

    def replaced_token_detection(self, config: ElectraConfig, fraction: float):
        return electra_rtd.detector(config, fraction)

    def generator_fraction(self, config: ElectraConfig, params: Any) -> float:
        return generator_lib.trained_config(config, params).hidden_size / config.hidden_size

    def replaced_logits(
        self, config, params, input_ids, token_type_ids, attention_mask, packed_length=None
    ):
        return electra_model.ElectraPreTraining(config).apply(
            {"params": params},
            input_ids,
            token_type_ids,
            attention_mask,
            packed_length=packed_length,
            method=electra_model.ElectraPreTraining.replaced_logits,
        )  # [b, s]

    # ---------------------------------------------------------------- transformers

    def read_transformers(
        self,
        path: str | os.PathLike,
        hf_config: Mapping[str, Any],
        *,
        pretraining_heads: bool = True,
        **overrides,
    ):
        return electra_hf.read(path, hf_config, pretraining_heads=pretraining_heads, **overrides)

    def encoder_files(self, config: ElectraConfig, params: Any) -> tuple[dict, dict]:
        return electra_hf.encoder_files(config, params)

    def write_transformers(
        self,
        config: ElectraConfig,
        params: Any,
        directory: str | os.PathLike,
        *,
        tokenizer: Any = None,
        head: Any = None,
        untrained: Sequence[str] = (),
    ) -> None:
        electra_hf.write(
            config, params, directory, tokenizer=tokenizer, head=head, untrained=untrained
        )


def _network(config: ElectraConfig, params: Any, lacks: str) -> family.Network:
    """An ElectraPreTraining of `params` with its head `lacks` freshly initialised; that head
    and the classifier's trunk (the pooler, which replaced-token detection never trains) are
    its untrained groups."""
    flat = dict(hf.flatten_tree(nn.meta.unbox(params)))
    # The generator's tree has no pooler at all: made too, so each network's tree is whole.
    paths = [
        s.path
        for s in electra_hf.pretraining_specs(config)
        if s.group == lacks or (s.group == electra_model.POOLER and s.path not in flat)
    ]
    for path, value in electra_hf.fresh_params(config, paths).items():
        flat[path] = value.astype(np.dtype(config.param_dtype))
    return family.Network(
        config, hf.unflatten_tree(flat), tuple(sorted({lacks, electra_model.POOLER}))
    )


FAMILY = Electra()
