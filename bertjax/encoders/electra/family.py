"""ELECTRA as an encoder family: the interface the capabilities use (bertjax.encoders.family).

An ELECTRA pretrains with replaced-token detection (objective "rtd",
bertjax.pretrain.objectives.rtd) from a preset (ElectraConfig.preset), its generator the
family's (`generator`). Transformers' ELECTRA directories open (Model.load, fine-tuning's
init_from), every capability but seq2seq runs on them, and they travel back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import flax.linen as nn

from bertjax import capability
from bertjax.encoders import family
from bertjax.encoders.electra import hf as electra_hf
from bertjax.encoders.electra import model as electra_model
from bertjax.encoders.electra.config import ARCHITECTURE_FIELDS, ElectraConfig


class Electra(family.EncoderFamily):
    name = "electra"
    # google-research/electra fine-tunes at its model config's 0.1 (BertConfig's defaults,
    # which configure_finetuning does not override).
    finetune_dropout = MappingProxyType({"hidden_dropout": 0.1, "attention_dropout": 0.1})
    config_class = ElectraConfig
    model_type = electra_hf.MODEL_TYPE
    sentence_pair_head = False
    architecture_fields = ARCHITECTURE_FIELDS
    generator = staticmethod(electra_model.generator)
    module = staticmethod(electra_model.ElectraEncoder)
    pretraining_model = staticmethod(electra_model.ElectraPreTraining)
    pretraining_init = staticmethod(electra_model.pretraining_init)
    pretraining_tensors = staticmethod(electra_hf.pretraining_specs)
    read_transformers = staticmethod(electra_hf.read)
    encoder_files = staticmethod(electra_hf.encoder_files)
    write_transformers = staticmethod(electra_hf.write)

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

    def head(
        self, config: ElectraConfig, name: str, outputs: int, reads: str, task_class: str = ""
    ) -> family.Head:
        """transformers' ELECTRA heads: a sequence head is ElectraClassificationHead, dropout
        -> dense -> GELU -> dropout -> out_proj on [CLS], whose first three steps the encoder
        computes as its pooled output (its dense layer is "pooler" in every ELECTRA tree) and
        whose last two the module does; a token head is dropout -> dense. The dropout rate
        is classifier_rate, as in ElectraForTokenClassification. ElectraForPreTraining's
        (capability.REPLACED_TOKENS) is ElectraDiscriminatorPredictions, dense -> hidden_act
        -> dense, with no dropout."""
        tensors = electra_hf.head_tensors(config, name, outputs, reads, task_class)
        if task_class == capability.REPLACED_TOKENS.task_class:
            return family.Head(
                reads, 0.0, electra_model.DiscriminatorHead(config, name=name), tensors
            )
        init = nn.initializers.truncated_normal(config.initializer_range)
        return family.Head(
            reads, config.classifier_rate, family.projection(config, outputs, name, init), tensors
        )


FAMILY = Electra()
