"""The interface an encoder family implements, and the registry the hubs ask.

A family is one encoder architecture (BERT, ModernBERT): its config class, its linen module
with the one call signature every head uses, its masked-LM model, and its transformers
format. The capability packages (bertjax.tasks) build their heads on `family_of(config)`,
so a head written once runs on every family, and a run directory, `Model` and fine-tuning
open any family's checkpoints through the same code.

The encoder module's call, for every family::

    sequence, pooled = family.module(config, name=ENCODER)(
        input_ids, token_type_ids, attention_mask, *, deterministic, packed_length=None,
        cls_only=False, token_head=False)

  sequence  [batch, seq, hidden]: the last hidden states, or with ``token_head`` what a head
            over tokens reads (ModernBERT runs its prediction head and dropout over every
            token, as its transformers token and span classes do; BERT's token heads read
            the hidden states themselves). With ``cls_only`` a family may return the [CLS]
            position alone ([batch, 1, hidden]).
  pooled    [batch, hidden]: what a sequence head reads. BERT: the tanh pooler on [CLS].
            ModernBERT: [CLS] or the mean over real tokens (config.classifier_pooling), then
            dense -> GELU -> LayerNorm -> dropout. ELECTRA: dropout -> dense -> GELU on
            [CLS], the first layer of its transformers classification head.

Besides its call, every family's encoder module offers what a network built beside it reads
(replaced-token detection's generator and discriminator, bertjax.pretrain.objectives.rtd)::

    module.embed(input_ids, token_type_ids=None, *, deterministic, positions=None)
        -> [batch, seq, embedding]: the embedded tokens, as the layers (or the projection to
           the hidden size) read them
    module.word_table() -> [vocab, embedding]: the word embeddings a tied decoder reads
    module.hidden_states(input_ids, token_type_ids=None, attention_mask=None, *,
                         deterministic, packed_length=None, document_ids=None, positions=None)
        -> [batch, seq, hidden]: the last hidden states, no pooled output or head computed

A task head is one object the family builds (`EncoderFamily.head`, a `Head`): its linen
module and the tensor map of every layer transformers' class of it has, so a head of more
than one layer travels as one. The capabilities describe a head in no family's terms
(bertjax.capability.TransformersHead: task class, name, width, what it reads); the family
says what it is made of. A replaced-token detector's discriminator head is described so too
(capability.REPLACED_TOKENS, task class ForPreTraining): ELECTRA's is ElectraForPreTraining's
discriminator_predictions, ModernBERT's dense -> GELU -> dense, which no class holds.

Where a family's checkpoints keep a layer of a task head in the encoder's tree, the encoder
computes that layer as its pooled output and the head's tensor map names it there:
ModernBERT's prediction head (pretrained by the masked LM, which shares it), ELECTRA's
classifier.dense (under "pooler" in every ELECTRA tree, pretraining ones included, so that
every checkpoint keeps its layout).

Whatever the family, the encoder's parameters live under one key of every task model
(bertjax.capability.ENCODER), so a warm start copies one subtree.
``token_type_ids`` are read only by families that have segments (BERT, ELECTRA); the others
ignore them (absent or not). ``packed_length`` is a speed hint: a family without packing
ignores it and computes the same outputs.

A family with a `generator` (the one member for a network beside another: ELECTRA's and
ModernBERT's) makes replaced-token detection's generator of a config: a masked LM a fraction
as wide that reads another network's embedded tokens and word table (`Generator`).

`read_transformers(path)` opens a transformers directory of any family (config.json's
model_type chooses); `family_of(config).write_transformers` writes one.

A checkpoint's meta records the config with `config_to_dict` (the family's name under
FAMILY_KEY); `config_from_dict` reads it back, a dict without the name being BERT's, as
every checkpoint written before families were.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.nn.sharding import EMBED, LABELS
from bertjax.storage import fs, hf

# The key of the family's name in a checkpoint's model_config.
FAMILY_KEY = "family"
# The family of a model_config without FAMILY_KEY, and of config.json without model_type.
DEFAULT_FAMILY = "bert"


class EncoderConfig(Protocol):
    """What family-neutral code reads of any family's config (BertConfig, ModernBertConfig,
    ElectraConfig): its family's name, its size and its numerics. Everything else is asked
    of the family (`family_of(config)`)."""

    family: ClassVar[str]
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    dtype: str
    param_dtype: str
    attention_impl: str
    remat_policy: str
    scan_layers: bool


class PretrainingOutput(NamedTuple):
    """What a family's pretraining model returns (BERT's BertOutput has these fields too)."""

    mlm_logits: jax.Array  # [batch, predictions, vocab], float32
    nsp_logits: jax.Array | None  # [batch, 2]; None without a sentence-pair head
    sequence_output: jax.Array | None = None  # [batch, seq, hidden]: the last hidden states


class Generator(NamedTuple):
    """A masked LM of a family beside another network of it, reading that network's embedded
    tokens and word table in place of its own (one table for both): replaced-token
    detection's generator (`EncoderFamily.generator`).

      config    the generator's config: a model of the family, a fraction as wide
      module    its linen module (unnamed), called as the family's pretraining model is with
                two more keywords, ``embedded`` [b, s, e] (the other network's `embed`) and
                ``word_table`` [v, e] (its `word_table()`); its tree has no embeddings
      pretraining_params  (its parameters, the other network's encoder parameters) -> the
                family's pretraining tree of `config` holding them, the other network's
                embeddings as its own (the groups the generator has no part of left out)
    """

    config: Any
    module: nn.Module
    pretraining_params: Callable[[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Head:
    """A task head on a family's encoder, as one object (EncoderFamily.head): what it reads
    (POOLED or TOKENS, bertjax.capability), the dropout rate before it, its linen `module`
    (features [..., hidden] -> float32 outputs [..., outputs], its parameters under its own
    name beside the encoder's) and its `tensors`: the tensor map of every layer the head has
    in transformers' <Family>For<Task> class, with the parameter's path in a task model's
    tree. A head of more than one layer lists each (ELECTRA's sequence head: classifier.dense
    and classifier.out_proj); a layer the tree keeps under the encoder (its path starts with
    the encoder's key) is the encoder's to compute (ELECTRA's and ModernBERT's pooled output),
    the rest are the module's."""

    reads: str
    dropout: float
    module: nn.Module
    tensors: tuple[hf.TensorSpec, ...]


def projection(config: EncoderConfig, features: int, name: str, kernel_init: Callable):
    """A head's dense layer [hidden, features] under `name`: `kernel_init` (the family's),
    zero bias, float32 outputs (they feed the loss directly, as the NSP head's do)."""
    return nn.Dense(
        features,
        dtype=jnp.float32,
        param_dtype=jnp.dtype(config.param_dtype),
        kernel_init=nn.with_logical_partitioning(kernel_init, (EMBED, LABELS)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (LABELS,)),
        name=name,
    )


def dense_tensors(hf_name: str, path: tuple[str, ...], n_in: int, n_out: int, group: str):
    """The tensor map of a torch Linear [out, in] and our Dense [in, out] at `path`."""
    return (
        hf.TensorSpec(
            f"{hf_name}.weight", (*path, "kernel"), (n_out, n_in), (n_in, n_out), True, group
        ),
        hf.TensorSpec(f"{hf_name}.bias", (*path, "bias"), (n_out,), (n_out,), False, group),
    )


class EncoderFamily:
    """One encoder architecture; see the module docstring for the module's call.

    Members:
      name              the family's name in checkpoint meta ("bert", "modernbert")
      config_class      its frozen config dataclass, whose class attribute `family` is this
                        family's name (`family_of` reads it)
      model_type        transformers' config.json model_type
      sentence_pair_head  whether the masked-LM model has a pooler and next-sentence head
                        (BERT's); without one, pretraining's objective is the masked LM alone
      feed_forward_matrices  [hidden, intermediate] matrices per feed-forward (2, or 3 for a
                        gated one), for the FLOPs count
      architecture_fields  the config fields that fix what the weights mean (a checkpoint
                        opens only into a config with the same values)
      phase_fields      architecture fields a new training phase (config.init_from) may change
                        without changing the weights' shapes, e.g. a longer context's rotary
                        theta
      finetune_dropout  fine-tuning's dropout where the run's config.model leaves it unset
                        (settings' names: hidden_dropout, attention_dropout); a field not
                        named keeps the checkpoint's own
      generator         `(config, fraction) -> Generator`: replaced-token detection's
                        generator beside a network of `config`, or None where the family
                        has none

    The family's modules and its transformers format, held as its own modules' functions:
      module(config, name=None) -> the encoder module (the module docstring's call)
      pretraining_model(config) -> the masked-LM model pretraining trains (the tree of
                        `pretraining_init`)::

                            output = model(input_ids, token_type_ids, attention_mask,
                                           masked_lm_positions, *, deterministic,
                                           packed_length=None, document_ids=None,
                                           positions=None)

                        with ``output.mlm_logits``, ``output.nsp_logits`` (None without a
                        sentence-pair head) and ``output.sequence_output``; ``document_ids``
                        and ``positions`` [batch, seq] describe rows of packed documents: a
                        token attends only within its document, positions restart per
                        document
      pretraining_init(config) -> `rng -> boxed parameters` of the masked-LM model (the tree
                        a pretrained encoder's checkpoint or transformers directory is read
                        into)
      pretraining_tensors(config) -> the tensor map (hf.TensorSpec, plain layout) of that
                        tree as transformers' pretraining class holds it, with each
                        parameter's group (CORE, POOLER, MLM_HEAD, ...)
      read_transformers(path, hf_config, *, pretraining_heads=True, **overrides) -> (config,
                        params, head or None, the parameter groups the files did not have,
                        freshly initialised, e.g. "mlm_head"); without `pretraining_heads`
                        (a fine-tuning run) pretraining heads the files lack need not be made
      encoder_files(config, params) -> (config.json, tensors) of the encoder alone
                        (params[ENCODER] of any task model) as transformers' <prefix>Model:
                        what a sentence-transformers Transformer module holds
      write_transformers(config, params, directory, *, tokenizer=None, head=None,
                        untrained=()) writes a transformers directory (config.json,
                        model.safetensors, tokenizer files)
    """

    name: str = ""
    config_class: type = object
    model_type: str = ""
    sentence_pair_head: bool = True
    feed_forward_matrices: int = 2
    architecture_fields: tuple[str, ...] = ()
    phase_fields: tuple[str, ...] = ()
    finetune_dropout: Mapping[str, float] = MappingProxyType({})
    generator: Callable[[Any, float], Generator] | None = None
    module: Callable[..., nn.Module]
    pretraining_model: Callable[[Any], nn.Module]
    pretraining_init: Callable[[Any], Callable[[jax.Array], Any]]
    pretraining_tensors: Callable[[Any], Sequence[hf.TensorSpec]]
    read_transformers: Callable[..., tuple]
    encoder_files: Callable[[Any, Any], tuple[dict, dict]]
    write_transformers: Callable[..., None]

    # ---------------------------------------------------------------- config

    def config_to_dict(self, config: Any) -> dict:
        """The config's fields, JSON-serialisable (without the family's name)."""
        raise NotImplementedError

    def config_from_dict(self, d: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def from_settings(self, preset: str, fields: Mapping[str, Any]) -> Any:
        """The config of a pretraining run's config.model: a preset with field overrides (the
        settings' names for dropout and attention are read as with_overrides reads them). The
        vocabulary and special token ids are provisional until `with_vocabulary`."""
        raise NotImplementedError

    def with_vocabulary(self, config: Any, tokenizer: Any) -> Any:
        """`config` for a tokenizer (bertjax.text.tokenizer's): its vocabulary size, and its
        special ids where the config records them."""
        raise NotImplementedError

    def with_overrides(self, config: Any, overrides: Mapping[str, Any]) -> Any:
        """`config` with a fine-tuning run's config.model fields (the settings' names, which
        every family reads: dtype, attention_impl, remat_policy, hidden_dropout,
        attention_dropout) in this family's terms."""
        raise NotImplementedError

    def describe(self, config: Any) -> str:
        """A short line naming the architecture, e.g. "BERT L12/H768/A12"."""
        return f"{self.name} L{config.num_layers}/H{config.hidden_size}/A{config.num_heads}"

    # ---------------------------------------------------------------- heads

    def head(self, config: Any, name: str, outputs: int, reads: str, task_class: str = "") -> Head:
        """The task head `name` of `outputs` that reads the encoder's pooled row or its
        tokens (`reads`, bertjax.capability's POOLED or TOKENS), as this family's
        transformers class <prefix><task_class> holds it. Every task class gets the
        family's task head of its `reads` but ForPreTraining (capability.REPLACED_TOKENS),
        which gets the family's replaced-token head (ELECTRA's ElectraForPreTraining's,
        ModernBERT's own; BERT has none and refuses)."""
        raise NotImplementedError

    def transformers_class(self, config: Any) -> bool:
        """Whether transformers has a class for this config (save_hf can write it)."""
        return True


_FAMILIES: dict[str, EncoderFamily] = {}
# The functions every family holds as members (EncoderFamily's docstring).
_HELD_FUNCTIONS = (
    "module",
    "pretraining_model",
    "pretraining_init",
    "pretraining_tensors",
    "read_transformers",
    "encoder_files",
    "write_transformers",
)


def register(family: EncoderFamily) -> EncoderFamily:
    """Adds a family (bertjax.encoders does, for each one it lists)."""
    if _FAMILIES.get(family.name, family) is not family:
        raise ValueError(f"encoder family {family.name!r} is registered twice")
    if getattr(family.config_class, "family", None) != family.name:
        raise ValueError(
            f"{family.config_class.__name__}.family must name its family {family.name!r}"
        )
    lacking = [name for name in _HELD_FUNCTIONS if not callable(getattr(family, name, None))]
    if lacking:
        raise ValueError(f"encoder family {family.name!r} holds no {lacking}")
    _FAMILIES[family.name] = family
    return family


def names() -> tuple[str, ...]:
    return tuple(_FAMILIES)


def get(name: str) -> EncoderFamily:
    """The family of a name."""
    if name not in _FAMILIES:
        raise ValueError(f"encoder family {name!r} is unknown: valid families are {names()}")
    return _FAMILIES[name]


def family_of(config: EncoderConfig) -> EncoderFamily:
    """The family a config names (its class's `family`)."""
    name = getattr(type(config), "family", None)
    if name not in _FAMILIES:
        raise ValueError(
            f"{type(config).__name__} is no encoder family's config: valid configs are "
            f"{[f.config_class.__name__ for f in _FAMILIES.values()]}"
        )
    return _FAMILIES[name]


def for_model_type(model_type: str | None) -> EncoderFamily:
    """The family of transformers' config.json model_type (None: BERT)."""
    model_type = model_type or _FAMILIES[DEFAULT_FAMILY].model_type
    for family in _FAMILIES.values():
        if family.model_type == model_type:
            return family
    raise ValueError(
        f"config.json: model_type={model_type!r} is not supported; valid: "
        f"{[f.model_type for f in _FAMILIES.values()]}"
    )


def config_to_dict(config: Any) -> dict:
    """A config as checkpoint meta records it: its fields and its family's name."""
    family = family_of(config)
    return {**family.config_to_dict(config), FAMILY_KEY: family.name}


def config_from_dict(d: Mapping[str, Any]) -> Any:
    """Inverse of `config_to_dict`; a dict without a family's name is a BERT config."""
    fields = dict(d)
    return get(fields.pop(FAMILY_KEY, DEFAULT_FAMILY)).config_from_dict(fields)


def read_transformers(path: str | os.PathLike, *, pretraining_heads: bool = True, **overrides):
    """Reads a transformers directory of any registered family, the family chosen by
    config.json's model_type: (config, params, head or None, the parameter groups the files
    did not have, freshly initialised). `overrides` are config fields (e.g. dtype)."""
    directory = fs.path(path)
    if fs.kind(directory) != "directory":
        raise FileNotFoundError(
            f"{directory}: not a directory (expected a transformers directory with "
            f"{hf.CONFIG_NAME} and {hf.SAFE_WEIGHTS_NAME})"
        )
    config_path = directory / hf.CONFIG_NAME
    if fs.kind(config_path) != "file":
        raise FileNotFoundError(f"{config_path}: missing; a transformers directory needs it")
    hf_config = hf.read_config(config_path)
    family = for_model_type(hf_config.get("model_type"))
    return family.read_transformers(
        directory, hf_config, pretraining_heads=pretraining_heads, **overrides
    )
