"""BERT as an encoder family: the interface the capabilities use (bertjax.encoders.family)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import flax.linen as nn

from bertjax import capability
from bertjax.encoders import family
from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert import model as bert_model
from bertjax.encoders.bert.config import ARCHITECTURE_FIELDS, BertConfig
from bertjax.encoders.bert.model import BertForPreTraining, BertModel


class BertEncoder(BertModel):
    """BertModel with the families' call: BERT's token heads read the hidden states, so
    ``token_head`` changes nothing. Parameters and outputs are BertModel's."""

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic=True,
        packed_length: int | None = None,
        cls_only: bool = False,
        token_head: bool = False,
    ):
        return super().__call__(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            cls_only=cls_only,
        )


class Bert(family.EncoderFamily):
    name = "bert"
    # google-research/bert fine-tunes at its configs' 0.1 (bert_config.json), whatever a
    # small model here was pretrained with.
    finetune_dropout = MappingProxyType({"hidden_dropout": 0.1, "attention_dropout": 0.1})
    config_class = BertConfig
    model_type = "bert"
    architecture_fields = ARCHITECTURE_FIELDS
    module = staticmethod(BertEncoder)
    pretraining_model = staticmethod(BertForPreTraining)
    pretraining_tensors = staticmethod(bert_hf.tensor_specs)
    read_transformers = staticmethod(bert_hf.read)
    encoder_files = staticmethod(bert_hf.encoder_files)
    write_transformers = staticmethod(bert_hf.save)

    def config_to_dict(self, config: BertConfig) -> dict:
        return config.to_dict()

    def config_from_dict(self, d: Mapping[str, Any]) -> BertConfig:
        return BertConfig.from_dict(dict(d))

    def from_settings(self, preset: str, fields: Mapping[str, Any]) -> BertConfig:
        return BertConfig.preset(preset, **fields)

    def with_vocabulary(self, config: BertConfig, tokenizer: Any) -> BertConfig:
        return dataclasses.replace(config, vocab_size=tokenizer.vocab_size)

    def with_overrides(self, config: BertConfig, overrides: Mapping[str, Any]) -> BertConfig:
        return dataclasses.replace(config, **overrides)

    def describe(self, config: BertConfig) -> str:
        return f"BERT L{config.num_layers}/H{config.hidden_size}/A{config.num_heads}"

    def head(
        self, config: BertConfig, name: str, outputs: int, reads: str, task_class: str = ""
    ) -> family.Head:
        """One dense layer, google's truncated normal, after the config's hidden_dropout (0.1,
        google's and transformers' rate); a sequence head reads the tanh pooler."""
        if task_class == capability.REPLACED_TOKENS.task_class:
            raise ValueError(
                "transformers' BertForPreTraining has no replaced-token head: it holds the "
                "masked LM and the next-sentence head"
            )
        init = nn.initializers.truncated_normal(config.initializer_range)
        return family.Head(
            reads,
            config.hidden_dropout,
            family.projection(config, outputs, name, init),
            bert_hf.head_tensors(config, name, outputs),
        )

    def pretraining_init(self, config: BertConfig):
        return bert_model.pretraining_init(BertForPreTraining(config), 1, 1)


FAMILY = Bert()
