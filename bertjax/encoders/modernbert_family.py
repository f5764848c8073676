"""ModernBERT as an encoder family: the encoder with its prediction head, its masked-LM model,
and transformers' ModernBert* directories in and out.

In a task model the encoder's tree ("bert") holds ModernBertModel's parameters and "head",
the prediction head (dense -> GELU -> LayerNorm) that transformers' ModernBertFor* classes
share: the masked-LM model reads it at the masked positions, the sequence classifier on the
pooled row, the token and span classifiers at every token. So a fine-tuned model adds only
its dense layer, and a masked-LM checkpoint starts every head's trunk, as in transformers.

transformers' names: "model." + ModernBertModel's tensors, "head.dense" and "head.norm",
"decoder.bias" (the masked-LM decoder's weight is the token-embedding table, tied, and not
written), and a task's dense layer "classifier" [outputs, hidden] (ModernBertFor
QuestionAnswering names its [2, hidden] layer "classifier" too).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability, fs, hf
from bertjax.encoders import family
from bertjax.encoders import modernbert as mb
from bertjax.encoders.modernbert import ModernBertConfig
from bertjax.sharding import VOCAB

# The encoder's key in our trees (every family's) and its prefix in transformers' names.
ENCODER = capability.ENCODER
HF_PREFIX = "model."
HEAD = "head"
DECODER_BIAS = "decoder_bias"
TIED_DECODER = "decoder.weight"
# transformers' name of a task's dense layer in every ModernBertFor* class.
HF_CLASSIFIER = "classifier"

# Parameter groups a directory may lack (freshly initialised, reported as Model.fresh_heads).
CORE = "core"
MLM_HEAD = "mlm_head"
POOLER = "pooler"


class Encoder(mb.ModernBertModel):
    """ModernBertModel and its prediction head, with the families' call (see
    bertjax.encoders.family): pooled is the head on [CLS] or the mean over real tokens;
    ``token_head`` runs the head over every token. Segment ids are ignored;
    ``packed_length`` runs the dense layers on real tokens only (ModernBertModel's token
    packing); with ``cls_only`` every position is still computed (mean pooling needs them).
    ``document_ids`` and ``positions`` describe rows of packed documents (ModernBertModel's
    ``segment_ids`` and ``positions``)."""

    def setup(self):
        super().setup()
        self.head = mb.PredictionHead(self.config)
        self.head_dropout = nn.Dropout(self.config.classifier_dropout)

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
        cls_only: bool = False,
        token_head: bool = False,
        document_ids=None,
        positions=None,
    ):
        cfg = self.config
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        x = super().__call__(
            input_ids,
            attention_mask,
            deterministic=deterministic,
            segment_ids=document_ids,
            positions=positions,
            packed_length=packed_length,
        )  # [b, s, h]
        if cfg.classifier_pooling == "cls":
            pooled = x[:, :1]  # [b, 1, h]
        else:
            weights = attention_mask.astype(jnp.float32)[..., None]  # [b, s, 1]
            total = jnp.sum(x.astype(jnp.float32) * weights, axis=1, keepdims=True)  # [b, 1, h]
            pooled = total / jnp.sum(weights, axis=1, keepdims=True)  # [b, 1, h]
        pooled = self.head_dropout(self.head(pooled), deterministic=deterministic)[:, 0]  # [b, h]
        if token_head:
            x = self.head_dropout(self.head(x), deterministic=deterministic)  # [b, s, h]
        return x, pooled

    def predictions(self, x: jax.Array) -> jax.Array:
        """The prediction head alone (the masked-LM model's trunk): [b, p, h] -> [b, p, h]."""
        return self.head(x)


class MaskedLM(nn.Module):
    """The encoder ("bert", with the head) and the tied decoder's bias: float32 logits
    [batch, seq or predictions, vocab], as transformers' ModernBertForMaskedLM, with the
    families' pretraining call (bertjax.encoders.family): ``mlm_logits`` and no sentence-pair
    head (``nsp_logits`` None); ``packed_length`` as the encoder's."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.bert = Encoder(cfg)
        if cfg.decoder_bias:
            self.decoder_bias = mb._param(
                self, DECODER_BIAS, nn.initializers.zeros_init(), (cfg.vocab_size,), (VOCAB,), cfg
            )

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        masked_lm_positions=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
        document_ids=None,
        positions=None,
    ) -> family.PretrainingOutput:
        cfg = self.config
        x, _ = self.bert(
            input_ids,
            None,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
        )  # [b, s, h]
        bias = self.decoder_bias if cfg.decoder_bias else None
        logits = mb.masked_lm_logits(
            cfg, x, masked_lm_positions, self.bert.predictions, self.bert.token_table(), bias
        )  # [b, p, v]
        return family.PretrainingOutput(mlm_logits=logits, nsp_logits=None)


def _init_masked_lm(config: ModernBertConfig, rng: jax.Array):
    ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
    # The parameters do not depend on the attention implementation; a one-token row is no
    # shape for a fused kernel to compile for.
    config = dataclasses.replace(config, attention_impl="xla")
    return MaskedLM(config).init({"params": rng}, ids)["params"]


# ---------------------------------------------------------------------------------------------
# transformers' tensors


@dataclasses.dataclass(frozen=True)
class Spec:
    """A transformers tensor, its parameter, and the group a directory may lack."""

    tensor: mb.TensorSpec
    group: str


def tensor_specs(config: ModernBertConfig, head_param: str | None, outputs: int = 0) -> list[Spec]:
    """Every transformers tensor of a ModernBertForMaskedLM (`head_param` None) or of a task
    class whose dense layer is `head_param` in our tree (`outputs` wide), in transformers'
    order, with paths in our tree."""
    specs = [
        Spec(dataclasses.replace(s, hf_name=HF_PREFIX + s.hf_name, path=(ENCODER, *s.path)), CORE)
        for s in mb.tensor_specs(config, mb.MODEL)
    ]
    specs += [
        Spec(dataclasses.replace(s, path=(ENCODER, *s.path)), POOLER)
        for s in mb.tensor_specs(config, mb.CLASSIFICATION, 1)
        if s.hf_name.startswith(HEAD + ".")
    ]
    if head_param is None:
        specs += [
            Spec(dataclasses.replace(s, path=(DECODER_BIAS,)), MLM_HEAD)
            for s in mb.tensor_specs(config, mb.MASKED_LM)
            if s.hf_name == "decoder.bias"
        ]
        return specs
    h = config.hidden_size
    specs.append(
        Spec(
            mb.TensorSpec(
                f"{HF_CLASSIFIER}.weight", (head_param, "kernel"), (outputs, h), (h, outputs), True
            ),
            head_param,
        )
    )
    specs.append(
        Spec(
            mb.TensorSpec(
                f"{HF_CLASSIFIER}.bias", (head_param, "bias"), (outputs,), (outputs,), False
            ),
            head_param,
        )
    )
    return specs


def _transformers_head(head) -> capability.TransformersHead:
    th = capability.of(head).transformers_head(head)
    if th is None:
        raise ValueError(
            f"a {head.task} model is not a transformers ModernBERT class; Model.save_hf writes "
            "it in its own format"
        )
    return th


class ModernBert(family.EncoderFamily):
    name = "modernbert"
    config_class = ModernBertConfig
    model_type = "modernbert"
    class_prefix = "ModernBert"
    uses_segment_ids = False
    sentence_pair_head = False
    feed_forward_matrices = 3  # GeGLU: Wi holds the input and the gate, then Wo
    # Everything but the numerics, the attention implementation, the dropout rates and the
    # initialisation.
    architecture_fields = tuple(
        f.name
        for f in dataclasses.fields(ModernBertConfig)
        if f.name not in ("dtype", "param_dtype", "remat_policy", "scan_layers", "attention_impl")
        and not f.name.endswith("dropout")
        and not f.name.startswith("initializer_")
    )
    # Rotary positions have no table: a context-extension phase (ModernBERT: 1,024 -> 8,192
    # tokens with the global theta 10,000 -> 160,000) changes these and no weight's shape.
    phase_fields = ("max_position_embeddings", "global_rope_theta", "local_rope_theta")

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
        field too (bertjax.attention's implementations); classifier_dropout stays
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

    def module(self, config: ModernBertConfig, name: str | None = None) -> nn.Module:
        return Encoder(config, name=name)

    def head_dropout(self, config: ModernBertConfig) -> float:
        return 0.0  # the encoder's head applied classifier_dropout already

    def classifier_init(self, config: ModernBertConfig):
        return mb._init(config, mb._stds(config)["classifier"])

    def pretraining_model(self, config: ModernBertConfig) -> MaskedLM:
        return MaskedLM(config)

    def pretraining_init(self, config: ModernBertConfig):
        return lambda rng: _init_masked_lm(config, rng)

    def mlm_logits(self, config, params, input_ids, token_type_ids, attention_mask, positions):
        return (
            MaskedLM(config)
            .apply(
                {"params": params}, input_ids, None, attention_mask, positions, deterministic=True
            )
            .mlm_logits
        )  # [b, p, v]

    # ---------------------------------------------------------------- transformers

    def read_transformers(
        self,
        path: str | os.PathLike,
        hf_config: Mapping[str, Any],
        *,
        pretraining_heads: bool = True,
        **overrides,
    ):
        # pretraining_heads changes nothing here: ModernBERT's prediction head is also its
        # classifiers' pooling, so a missing one is made fresh either way (and not warned of).
        directory = fs.path(path)
        config = ModernBertConfig.from_hf_dict(hf_config, **{"dtype": "float32", **overrides})
        # The capabilities know BERT's class names: ask them with this family's translated.
        as_bert = {
            **hf_config,
            "architectures": [
                self.bert_architecture(a) for a in hf_config.get("architectures") or []
            ],
        }
        head = capability.head_from_transformers(as_bert)
        th = None if head is None else _transformers_head(head)
        specs = tensor_specs(
            config, None if th is None else th.param, 0 if th is None else th.outputs
        )
        tensors, source = hf.read_weights(directory)
        names = {s.tensor.hf_name for s in specs}
        found: dict[str, np.ndarray] = {}
        for name, array in tensors.items():
            if name not in names and HF_PREFIX + name in names:  # ModernBertModel: no prefix
                name = HF_PREFIX + name
            found[name] = np.asarray(array)
        if TIED_DECODER in found:
            decoder = found.pop(TIED_DECODER)
            table = found.get(f"{HF_PREFIX}embeddings.tok_embeddings.weight")
            if table is not None and not np.array_equal(decoder, table):
                raise ValueError(
                    f"{source}: tensor {TIED_DECODER!r} differs from the token embeddings; an "
                    "untied decoder is not supported"
                )
        unexpected = sorted(set(found) - names)
        if unexpected:
            raise ValueError(
                f"{source}: unexpected tensor(s) {hf.name_list(unexpected)} for a ModernBERT "
                f"with {config.num_layers} layers"
            )
        required = {CORE} if th is None else {CORE, POOLER, th.param}
        present = {s.group for s in specs if s.tensor.hf_name in found}
        dtype = np.dtype(config.param_dtype)
        flat: dict[tuple[str, ...], np.ndarray] = {}
        missing: list[str] = []
        for spec in specs:
            t = spec.tensor
            if t.hf_name not in found:
                if spec.group in required or spec.group in present:
                    raise ValueError(f"{source}: missing tensor {t.hf_name!r} (shape {t.hf_shape})")
                missing.append(spec.group)
                continue
            array = found[t.hf_name]
            if tuple(array.shape) != t.hf_shape:
                raise ValueError(
                    f"{source}: tensor {t.hf_name!r} has shape {tuple(array.shape)}, expected "
                    f"{t.hf_shape}"
                )
            flat[t.path] = t.to_ours(array).astype(dtype)
        if missing:
            init_config = dataclasses.replace(config, scan_layers=False, attention_impl="xla")
            fresh = dict(
                hf.flatten_tree(nn.meta.unbox(_init_masked_lm(init_config, jax.random.key(0))))
            )
            for spec in specs:
                if spec.group in missing:
                    flat[spec.tensor.path] = np.asarray(fresh[spec.tensor.path]).astype(dtype)
        params = hf.unflatten_tree(flat)
        if config.scan_layers:
            params[ENCODER] = jax.tree.map(np.asarray, mb.stack_layers(params[ENCODER], config))
        # Without the prediction head, neither masks nor a pooled row can be predicted.
        fresh_groups = set(missing) | ({MLM_HEAD} if POOLER in missing else set())
        return config, params, head, tuple(sorted(fresh_groups))

    def encoder_files(self, config: ModernBertConfig, params: Any) -> tuple[dict, dict]:
        # The encoder alone, as write_transformers writes an untrained head's model.
        return self._transformers_files(config, params, None, (MLM_HEAD,))

    def write_transformers(
        self,
        config: ModernBertConfig,
        params: Any,
        directory: str | os.PathLike,
        *,
        tokenizer: Any = None,
        head: Any = None,
        untrained: Sequence[str] = (),
    ) -> None:
        hf.require_safetensors()
        if tokenizer is not None:
            hf.check_vocab(config, tokenizer, f"saving to {directory}")
        hf_config, tensors = self._transformers_files(config, params, head, untrained)
        target = fs.path(directory)
        with hf.staged(target) as staging:
            hf.write_json(staging / hf.CONFIG_NAME, hf_config)
            hf.safetensors_numpy.save_file(
                tensors, staging / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"}
            )
            if tokenizer is not None:
                tokenizer.save_hf(staging, model_max_length=config.max_position_embeddings)

    def _transformers_files(
        self, config: ModernBertConfig, params: Any, head: Any, untrained: Sequence[str]
    ) -> tuple[dict, dict[str, np.ndarray]]:
        """(config.json, tensors): ModernBertForMaskedLM, ModernBertModel (an untrained
        prediction head: the encoder alone) or the class of `head`."""
        params = nn.meta.unbox(params)
        if set(params) == {"params"}:
            params = params["params"]
        if config.scan_layers:
            params = {**params, ENCODER: mb.unstack_layers(params[ENCODER], config)}
        hf_config = config.to_hf_dict()
        th = None if head is None else _transformers_head(head)
        if th is None:
            specs = tensor_specs(config, None)
            hf_config["architectures"] = ["ModernBertForMaskedLM"]
            if untrained:  # no trained prediction head: the encoder alone, as ModernBertModel
                specs = [s for s in specs if s.group == CORE]
                specs = [
                    Spec(
                        dataclasses.replace(
                            s.tensor, hf_name=s.tensor.hf_name.removeprefix(HF_PREFIX)
                        ),
                        s.group,
                    )
                    for s in specs
                ]
                hf_config["architectures"] = ["ModernBertModel"]
        else:
            specs = tensor_specs(config, th.param, th.outputs)
            hf_config["architectures"] = [self.architecture(th.architecture)]
            labels = {str(i): f"LABEL_{i}" for i in range(th.outputs)}
            hf_config.update(
                {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}
            )
            hf_config.update(th.config)
        flat = dict(hf.flatten_tree(params))
        tensors: dict[str, np.ndarray] = {}
        dtypes = set()
        for spec in specs:
            t = spec.tensor
            if t.path not in flat:
                raise ValueError(
                    f"params: missing parameter {'/'.join(t.path)!r} (shape {t.shape})"
                )
            array = hf.to_numpy(flat[t.path])
            if tuple(array.shape) != t.shape:
                raise ValueError(
                    f"params: parameter {'/'.join(t.path)!r} has shape {tuple(array.shape)}, "
                    f"expected {t.shape}"
                )
            tensors[t.hf_name] = t.to_hf(array)
            dtypes.add(array.dtype)
        if len(dtypes) == 1:
            hf_config["dtype"] = str(next(iter(dtypes)))
        return hf_config, tensors


FAMILY = ModernBert()
