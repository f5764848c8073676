"""ModernBERT as an encoder family: the interface the capabilities use (bertjax.encoders.family)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bertjax import capability
from bertjax.encoders import family
from bertjax.encoders.modernbert import hf as modernbert_hf
from bertjax.encoders.modernbert import model as model_lib
from bertjax.encoders.modernbert.config import ModernBertConfig

# The config fields that say how to compute, not what the weights mean.
_NUMERICS = (
    "dtype",
    "param_dtype",
    "matmul_dtype",
    "remat_policy",
    "scan_layers",
    "attention_impl",
)


class ModernBert(family.EncoderFamily):
    name = "modernbert"
    config_class = ModernBertConfig
    model_type = "modernbert"
    sentence_pair_head = False
    feed_forward_matrices = 3  # GeGLU: Wi holds the input and the gate, then Wo
    # Everything but the numerics, the attention implementation, the dropout rates and the
    # initialisation.
    architecture_fields = tuple(
        f.name
        for f in dataclasses.fields(ModernBertConfig)
        if f.name not in _NUMERICS
        and not f.name.endswith("dropout")
        and not f.name.startswith("initializer_")
    )
    # Rotary positions have no table: a context-extension phase (ModernBERT: 1,024 -> 8,192
    # tokens with the global theta 10,000 -> 160,000) changes these and no weight's shape.
    phase_fields = ("max_position_embeddings", "global_rope_theta", "local_rope_theta")
    generator = staticmethod(model_lib.generator)
    module = staticmethod(model_lib.Encoder)
    pretraining_model = staticmethod(model_lib.MaskedLM)
    pretraining_tensors = staticmethod(modernbert_hf.pretraining_specs)
    read_transformers = staticmethod(modernbert_hf.read)
    encoder_files = staticmethod(modernbert_hf.encoder_files)
    write_transformers = staticmethod(modernbert_hf.write)

    def config_to_dict(self, config: ModernBertConfig) -> dict:
        return dataclasses.asdict(config)

    def config_from_dict(self, d: Mapping[str, Any]) -> ModernBertConfig:
        known = {f.name for f in dataclasses.fields(ModernBertConfig)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown ModernBertConfig fields {unknown}: valid fields are {sorted(known)}"
            )
        return ModernBertConfig(**d)

    def from_settings(self, preset: str, fields: Mapping[str, Any]) -> ModernBertConfig:
        """ModernBERT's own field names win over BERT's (hidden_dropout, attention_dropout),
        which every pretraining config carries."""
        own = {f.name for f in dataclasses.fields(ModernBertConfig)}
        bert_named = {k: v for k, v in fields.items() if k not in own}
        # Provisional token ids (0 fits any vocabulary) until with_vocabulary sets the real ones.
        ids = dict(pad_token_id=0, cls_token_id=0, sep_token_id=0)
        config = ModernBertConfig.preset(preset, **ids)
        config = self.with_overrides(config, bert_named)
        return dataclasses.replace(config, **{k: v for k, v in fields.items() if k in own})

    def with_vocabulary(self, config: ModernBertConfig, tokenizer: Any) -> ModernBertConfig:
        return dataclasses.replace(
            config,
            vocab_size=tokenizer.vocab_size,
            pad_token_id=tokenizer.pad_id,
            cls_token_id=tokenizer.cls_id,
            sep_token_id=tokenizer.sep_id,
        )

    def with_overrides(self, config: ModernBertConfig, overrides: Mapping[str, Any]):
        """BERT's names in ModernBERT's terms: hidden_dropout is the embeddings' and the
        feed-forward's, attention_dropout the attention's; attention_impl is ModernBERT's own
        field too (bertjax.nn.attention's implementations); classifier_dropout stays
        the checkpoint's."""
        fields = {}
        for name, value in overrides.items():
            if name == "hidden_dropout":
                fields.update(embedding_dropout=value, mlp_dropout=value)
            else:
                fields[name] = value
        return dataclasses.replace(config, **fields)

    def describe(self, config: ModernBertConfig) -> str:
        return f"ModernBERT L{config.num_layers}/H{config.hidden_size}/A{config.num_heads}"

    def head(
        self,
        config: ModernBertConfig,
        name: str,
        outputs: int,
        reads: str,
        task_class: str = "",
    ) -> family.Head:
        """transformers' ModernBertFor* heads: the prediction head, then dropout and the task's
        dense layer. The encoder runs the prediction head and its dropout (classifier_dropout)
        on its pooled row, and with token_head over the tokens, since the masked-LM model
        shares it; the module is the dense layer, with no dropout of its own. A replaced-token
        head (capability.REPLACED_TOKENS) is dense -> GELU -> dense on the hidden states, which
        no transformers class holds."""
        if task_class == capability.REPLACED_TOKENS.task_class:
            return family.Head(reads, 0.0, model_lib.DiscriminatorHead(config, name=name), ())
        classifier = model_lib._init(config, model_lib._stds(config)["classifier"])
        return family.Head(
            reads,
            0.0,
            family.projection(config, outputs, name, classifier),
            modernbert_hf.head_tensors(config, name, outputs),
        )

    def pretraining_init(self, config: ModernBertConfig):
        return lambda rng: model_lib.init_masked_lm(config, rng)

    def transformers_class(self, config: ModernBertConfig) -> bool:
        # Projected embeddings (a replaced-token detection generator) are no transformers
        # ModernBERT.
        return config.embedding_width == config.hidden_size


FAMILY = ModernBert()
