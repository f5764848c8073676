"""Use a trained BERT: fill-mask, text embeddings and model inputs, from text.

`Model.load(path)` opens a bertjax work directory (its latest checkpoint, or `step=`), a
directory written by `Model.save_hf`, or a Hugging Face BERT or ModernBERT
directory (config.json, model.safetensors or pytorch_model.bin, and tokenizer.json or
vocab.txt)::

    m = bertjax.Model.load("runs/tiny")
    m.fill_mask("The [MASK] statement handles exceptions.")  # transformers' pipeline format
    m.embed(["first text", "second text"])                    # numpy [2, hidden]
    m.encode(["a question"], text_pairs=["a passage"])        # google's feature names

Batching (bertjax.inference.batching): texts sorted by length, padded to buckets that each
compile once, split over a mesh's data axes when there is one, run unpadded where packing
pays; calls over many texts show a progress bar.

Input mistakes raise InferenceError with one message naming the text and what is wrong;
texts longer than the model's positions are cut, with a TruncationWarning naming the limit.

The package: `Model` (here, the facade every notebook method is called on), batching.py (the
one batching path its methods share), vectors.py (cosine similarity, exact search). The
methods of a fine-tuned model (predict, answer, generate, a trained embed) come from its
capability (bertjax.tasks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability as capability_lib
from bertjax import encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.family import EncoderConfig
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import compilation_cache, rundir
from bertjax.engine import networks as networks_lib
from bertjax.inference import batching
from bertjax.inference import vectors as vectors_lib
from bertjax.nn import pooling as pooling_lib
from bertjax.nn import sharding
from bertjax.storage import fs, hf
from bertjax.text import features as features_lib
from bertjax.text.features import TruncationWarning  # noqa: F401  (callers catch it from here)
from bertjax.text.tokenizer import Tokenizer, check_vocab

POOLINGS = ("mean", "cls", "pooler")


class InferenceError(ValueError):
    """Input, or a directory, that inference cannot use; the message says what and why."""


class ExportError(InferenceError, OSError):
    """An export that could not be written (a full disk); an OSError too, as a failed write
    is, with the cause's errno."""


class Model:
    """A BERT with its tokenizer, ready for inference; see the module docstring.

    Build one with `Model.load(path)` or from pieces in memory: `Model(config, params,
    tokenizer)`, where params is BertForPreTraining's tree (plain or boxed, on the host or on
    devices). `dtype` overrides the compute dtype (e.g. "float32" for a model trained in
    bfloat16), `matmul_dtype` the products' operand dtype (e.g. "bfloat16" with a float32
    dtype: bfloat16's speed on a CPU with AVX512-BF16, activations in float32). `mesh`
    spreads batches and parameters over devices. A fine-tuned model has a `head`
    (bertjax.capability.HeadSpec) and its capability's parameter tree; the capability
    (bertjax.tasks) serves the methods that fit it: predict, answer, generate, embed.

    The batching path the methods share: `examples` / `token_ids` (text to inputs),
    `batched(function, features)` (length buckets, batch_size, mesh, progress bar) and
    `predict_masks` (fill-mask's core).
    """

    def __init__(
        self,
        config: EncoderConfig,
        params: Any,
        tokenizer: Tokenizer,
        *,
        mesh: jax.sharding.Mesh | None = None,
        batch_size: int = 32,
        dtype: str | None = None,
        matmul_dtype: str | None = None,
        progress: bool | None = None,
        source: str = "memory",
        fresh_heads: Sequence[str] = (),
        head: HeadSpec | None = None,
        unpad: bool = True,
    ):
        try:
            check_vocab(config, tokenizer, source)
        except ValueError as err:
            raise InferenceError(str(err)) from None
        batch_size = as_int(batch_size, "batch_size", 1)
        check_mesh(mesh)
        self.config = config
        # The encoder's architecture (bertjax.encoders): its modules and transformers format.
        self.family = encoders.family_of(config)
        self.tokenizer = tokenizer
        # The one batching path every method runs through (buckets, packing, mesh).
        self.batcher = batching.Batcher(
            max_positions=config.max_position_embeddings,
            mesh=mesh,
            batch_size=batch_size,
            progress=progress,
            unpad=as_bool(unpad, "unpad"),
        )
        self.source = source
        # Parameter groups the checkpoint did not have (freshly initialised by bert_hf.load).
        self.fresh_heads = tuple(fresh_heads)
        # A fine-tuned model's task, labels and options; it has no pretraining heads to fill
        # masks with. Its capability (bertjax.tasks) serves the notebook methods that fit it.
        self.head = head
        self.capability = None if head is None else capability_lib.of(head)
        if head is not None:
            self.fresh_heads = tuple(sorted({*self.fresh_heads, hf.MLM_HEAD, hf.NSP_HEAD}))
        # Inference never needs rematerialisation; the compute dtypes may be overridden.
        numerics = {"dtype": dtype or config.dtype}
        if matmul_dtype is not None:
            numerics["matmul_dtype"] = matmul_dtype
        try:
            self.run_config = dataclasses.replace(config, remat_policy="none", **numerics)
        except (ValueError, TypeError) as err:
            raise InferenceError(str(err)) from None
        self.params = self.batcher.place(params, self._abstract_params)
        # Networks a pretraining run trained beside this one, by name, each a Model (an
        # ELECTRA run's "generator": m.networks["generator"].fill_mask(...)).
        self.networks: dict[str, Model] = {}

    # ------------------------------------------------------------------------------------
    # Loading and saving

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        step: int | None = None,
        *,
        mesh: jax.sharding.Mesh | None = None,
        batch_size: int = 32,
        dtype: str | None = None,
        matmul_dtype: str | None = None,
        progress: bool | None = None,
        unpad: bool = True,
    ) -> Model:
        """Opens a bertjax work directory, a bertjax export or a Hugging Face BERT directory.

        `step` picks a checkpoint of a work directory (default: the latest readable one).
        Compiled programs are kept for the next session (bertjax.engine.compilation_cache).
        `unpad=False` runs every batch padded (see `packed_length`).
        """
        check_mesh(mesh)  # before the weights are read
        compilation_cache.enable()
        overrides = {"dtype": dtype} if dtype else {}
        try:
            # Local or gs://: a missing bucket, no credentials or no permission is said here,
            # in one line naming the path.
            if fs.kind(path) is None:
                raise InferenceError(f"{path} does not exist")
            # A directory in a capability's own format (sentence-transformers,
            # EncoderDecoderModel), or else a bertjax run or a transformers BERT directory.
            own = capability_lib.recognising(path)
        except fs.StorageError as err:
            raise InferenceError(str(err)) from None
        if own is not None:
            if step is not None:
                raise InferenceError(
                    f"step={step} applies to bertjax work directories; {path} holds a single "
                    "set of weights"
                )
            try:
                opened = own.open(path, **overrides)
            except (ValueError, FileNotFoundError, ImportError) as err:
                raise InferenceError(str(err)) from None
            return cls(
                opened.config,
                opened.params,
                opened.tokenizer,
                mesh=mesh,
                batch_size=batch_size,
                dtype=dtype,
                matmul_dtype=matmul_dtype,
                progress=progress,
                source=str(path),
                head=opened.head,
                unpad=unpad,
            )
        try:
            run = rundir.open_run(path, step, **overrides)
            restored_step, networks = rundir.read_networks(run)
        except (
            ValueError,
            FileNotFoundError,
            ImportError,
            checkpoint_lib.CheckpointRestoreError,
        ) as err:
            raise InferenceError(str(err)) from None
        if run.kind == rundir.HUGGING_FACE:
            source = str(run.path)
            dtype = None  # already the config's
        else:
            source = f"{run.path} step {restored_step}" + (" (best)" if run.best else "")

        def model(network: networks_lib.Network, source: str) -> Model:
            return cls(
                network.config,
                network.params,
                run.tokenizer,
                mesh=mesh,
                batch_size=batch_size,
                dtype=dtype,
                matmul_dtype=matmul_dtype,
                progress=progress,
                source=source,
                fresh_heads=network.fresh,
                head=run.head,
                unpad=unpad,
            )

        opened = model(networks[""], source)
        opened.networks = {
            name: model(network, f"{source}, its {name}")
            for name, network in networks.items()
            if name
        }
        return opened

    def save_hf(self, directory: str | os.PathLike) -> None:
        """Writes a transformers directory: weights, config.json and the tokenizer files.

        A fine-tuned model is written in its capability's format: BertFor* for label and
        question-answering heads, EncoderDecoderModel for seq2seq, a sentence-transformers
        directory for an embedding model. Networks trained beside this one (`networks`: an
        ELECTRA run's generator) are written in directories of their names inside it.
        """
        head = self.head
        if not self.family.transformers_class(self.config):
            raise InferenceError(
                f"{self.source}: transformers has no class for this model "
                f"({self.family.describe(self.config)}, e.g. a ModernBERT replaced-token "
                "detection generator's projected embeddings); it opens from its run's "
                "checkpoints with Model.load"
            )
        # A failure while writing (a full disk) leaves an export already there whole; it is
        # said in one line naming the directory and the cause.
        with as_inference_error(), _export_errors(directory):
            if head is not None and self.capability.transformers_head(head) is None:
                self.capability.save(self, directory)
                return
            # Heads this model never had (read from a BertModel directory) are not exported
            # as trained: the copy lacks them too, and refuses fill_mask as this one does.
            untrained = () if head is not None else self.fresh_heads
            self.family.write_transformers(
                self.config,
                self.params,
                directory,
                tokenizer=self.tokenizer,
                head=head,
                untrained=untrained,
            )
        # Networks trained beside this one, each in a directory of its name inside, where
        # transformers has a class for it (a ModernBERT generator's projected embeddings have
        # none: it stays in the run's checkpoints).
        for name, network in self.networks.items():
            if network.family.transformers_class(network.config):
                network.save_hf(fs.path(directory) / name)

    @property
    def batch_size(self) -> int:
        """Rows per batch: the batch_size asked for, rounded up to a multiple of the mesh's
        data-parallel size."""
        return self.batcher.batch_size

    def __repr__(self) -> str:
        return (
            f"Model({self.family.describe(self.config)}, "
            f"{self.tokenizer.kind} vocabulary of {self.tokenizer.vocab_size}, from {self.source})"
        )

    # ------------------------------------------------------------------------------------
    # What users call

    def encode(
        self,
        texts: str | Sequence[str],
        text_pairs: str | Sequence[str] | None = None,
        max_length: int | None = None,
    ) -> dict[str, np.ndarray]:
        """The model's inputs for texts (and pairs): int32 [n, longest] arrays.

        input_ids ([CLS] A [SEP], or [CLS] A [SEP] B [SEP]), input_mask and segment_ids,
        google-research/bert's names. Pairs longer than max_length (default: the model's
        positions) lose tokens from the longer text first, as google's run_classifier.py.
        """
        limit = self.config.max_position_embeddings
        with as_inference_error():
            return features_lib.encode(
                self.tokenizer,
                texts,
                text_pairs,
                limit if max_length is None else max_length,
                limit=limit,
            )

    def fill_mask(self, text_or_texts: str | Sequence[str], top_k: int = 5) -> list:
        """The top_k predictions for each [MASK] written in the text(s).

        Shaped like transformers' fill-mask pipeline: for one text with one [MASK], a list of
        {"score", "token", "token_str", "sequence"}; with several [MASK]s, one such list per
        mask; for a list of texts, a list of those.
        """
        if hf.MLM_HEAD in self.fresh_heads:
            beside = "".join(
                f"; its {name} does: .networks[{name!r}].fill_mask(...)"
                for name, network in self.networks.items()
                if hf.MLM_HEAD not in network.fresh_heads
            )
            raise InferenceError(
                f"{self.source} has no masked-LM head (cls.predictions.* in transformers' "
                f"names), so it cannot fill masks; embed and encode work{beside}"
            )
        single = isinstance(text_or_texts, str)
        texts = as_texts(text_or_texts, "text_or_texts")
        top_k = min(as_int(top_k, "top_k", 1), self.tokenizer.vocab_size)
        examples = self.examples(texts, None, None, mask_checked=True)
        results = []
        predictions = self.predict_masks([e.ids for e in examples], top_k)
        for example, (positions, scores, ids) in zip(examples, predictions):
            one_mask = len(positions) == 1
            per_mask = []
            for position, mask_scores, mask_ids in zip(positions, scores, ids):
                row = []
                for score, token in zip(mask_scores.tolist(), mask_ids.tolist()):
                    filled = list(example.ids)
                    filled[position] = token
                    row.append(
                        {
                            "score": score,
                            "token": token,
                            "token_str": self.tokenizer.decode([token]),
                            # As the pipeline: with several masks the others stay visible.
                            "sequence": self.tokenizer.decode(filled, skip_special=one_mask),
                        }
                    )
                per_mask.append(row)
            results.append(per_mask[0] if one_mask else per_mask)
        return results[0] if single else results

    def embed(
        self,
        texts: str | Sequence[str],
        pooling: str | None = None,
        normalize: bool | None = None,
    ) -> np.ndarray:
        """One float32 vector per text, [n, hidden].

        pooling: "mean" of the encoder's outputs over the text's tokens ([CLS] and [SEP]
        included, padding not), "cls" the output at [CLS], "pooler" the encoder's pooled
        output (BERT's tanh pooler on [CLS]; ModernBERT's prediction head on its pooled row).
        normalize: scale each vector to unit length. An embedding model (a trained embedding
        run, a sentence-transformers directory) embeds as it was trained when both are left
        out: its pooling ("max" too), normalisation and max_seq_length, empty texts included.
        """
        as_trained = self.capability.notebook.get("embed") if self.capability else None
        if as_trained is not None and pooling is None and normalize is None:
            return as_trained(self, texts)
        pooling = "mean" if pooling is None else pooling
        normalize = False if normalize is None else as_bool(normalize, "normalize")
        if not isinstance(pooling, str) or pooling not in POOLINGS:
            raise InferenceError(f"pooling={pooling!r} is invalid: choose one of {POOLINGS}")
        if pooling == "pooler" and hf.POOLER in self.fresh_heads:
            raise InferenceError(
                f"{self.source} has no pooler weights (bert.pooler.* in transformers' names); "
                "use pooling='mean' or 'cls'"
            )
        texts = as_texts(texts, "texts")
        examples = self.examples(texts, None, None)
        function = functools.partial(
            _embed, config=self.run_config, pooling=pooling, normalize=bool(normalize)
        )
        out = np.zeros((len(examples), self.config.hidden_size), np.float32)
        for rows, vectors in self.batched(function, [e.features() for e in examples]):
            out[rows] = vectors
        return out

    def replaced(self, texts: str | Sequence[str]) -> list:
        """Which tokens of each text a replaced-token detector thinks were replaced: an ELECTRA
        discriminator (a replaced-token detection run, an ElectraForPreTraining directory) or
        a ModernBERT one (a replaced-token detection run). Served by replaced-token detection
        (bertjax.pretrain.objectives.rtd.replaced, through bertjax.engine.networks).

        Per text, one {"index", "token", "score", "replaced"} per token ([CLS] and [SEP] left
        out): its position in the model's input, its piece, the probability that it was
        replaced and whether that passes 0.5. For one text, its list; for a list, a list.
        """
        return networks_lib.method("replaced")(self, texts)

    def predict(self, texts, text_pairs=None, max_length=None) -> Any:
        """A fine-tuned label head's predictions with their scores, per text (or pair):
        see bertjax.tasks.labels.predict."""
        return self._method("predict")(self, texts, text_pairs, max_length)

    def answer(self, question, context, top_k: int = 1, **options: Any) -> dict | list:
        """Answers as transformers' question-answering pipeline returns them: see
        bertjax.tasks.qa.answer."""
        return self._method("answer")(self, question, context, top_k=top_k, **options)

    def generate(self, texts, num_beams: int = 4, max_new_tokens: int = 64, **options: Any):
        """An encoder-decoder's generated text per source text: see
        bertjax.tasks.seq2seq.generate."""
        return self._method("generate")(
            self, texts, num_beams=num_beams, max_new_tokens=max_new_tokens, **options
        )

    def _method(self, name: str) -> Callable:
        """The function of this model's capability that serves `name`, or a one-line error
        naming the method that fits this model."""
        function = self.capability.notebook.get(name) if self.capability else None
        if function is not None:
            return function
        needs = [task for c in capability_lib.serving(name) for task in c.tasks if c.method == name]
        if self.capability is None:
            what, fits = "a pretrained encoder", "fill_mask(...) or embed(...)"
        else:
            what, fits = f"a {self.head.task} model", self.capability.usage
        raise InferenceError(
            f"{name}() needs a fine-tuned {' or '.join(needs) or 'model'} model; {self.source} "
            f"is {what}: use {fits}"
        )

    # ------------------------------------------------------------------------------------
    # Text to examples

    def examples(
        self,
        texts: list[str],
        pairs: list[str] | None,
        max_length: int | None,
        mask_checked: bool = False,
    ) -> list[features_lib.Example]:
        limit = self.config.max_position_embeddings
        with as_inference_error():
            return features_lib.inputs(
                self.tokenizer,
                texts,
                pairs,
                limit if max_length is None else max_length,
                limit=limit,
                need_mask=mask_checked,
            )

    def token_ids(self, texts: list[str], what: str) -> list[list[int]]:
        with as_inference_error():
            return features_lib.token_ids(self.tokenizer, texts, what)

    # ------------------------------------------------------------------------------------
    # Running the model

    def predict_masks(
        self, sequences: list[list[int]], top_k: int
    ) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """For token id sequences holding [MASK]s: per sequence, the mask positions and the
        top_k scores [masks, top_k] and ids [masks, top_k] at them."""
        mask_id = self.tokenizer.mask_id
        positions = [[p for p, t in enumerate(ids) if t == mask_id] for ids in sequences]
        features = [
            {
                **features_lib.Example(ids, [0] * len(ids)).features(),
                "masked_lm_positions": np.asarray(p),
            }
            for ids, p in zip(sequences, positions)
        ]
        # Jitted once for every Model: a model loaded again, or another model of the same
        # configuration, reuses what was compiled (once per bucket shape).
        function = functools.partial(
            _fill_mask, config=self.run_config, usable=self.tokenizer.vocab_size, top_k=top_k
        )
        scores: list[Any] = [None] * len(sequences)
        ids_out: list[Any] = [None] * len(sequences)
        for rows, (batch_scores, batch_ids) in self.batched(function, features):
            for row, s, t in zip(rows, batch_scores, batch_ids):
                count = len(positions[row])
                scores[row], ids_out[row] = s[:count], t[:count]
        return list(zip(positions, scores, ids_out))

    def batched(
        self,
        function: Callable,
        features: list[dict[str, np.ndarray]],
        max_length: int | None = None,
    ) -> Iterator:
        """Yields (rows, outputs) per batch: the rows of `features` and numpy outputs for them,
        `function(params, batch, packed_length=...)` run on this model's parameters over padded
        batches (bertjax.inference.batching.Batcher.batched; `max_length` caps the buckets)."""
        return self.batcher.batched(function, self.params, features, max_length)

    def _abstract_params(self) -> Any:
        """The shapes and logical axis names of this model's parameter tree (nothing is
        computed): how a mesh lays the parameters out."""
        if self.head is None:
            init = self.family.pretraining_init(self.run_config)
        else:
            init = self.capability.init(self.run_config, self.head)
        return jax.eval_shape(init, jax.random.key(0))

    def _vectors(self, *named: tuple[Any, str]) -> list[np.ndarray]:
        """[n, h] float32 vectors of each (texts or vectors, argument name): every argument
        is checked before any text is embedded."""
        checked = [_checked_vectors(value, name) for value, name in named]
        return [self.embed(x) if isinstance(x, list) else x for x in checked]

    def similarity(self, a: Any, b: Any) -> np.ndarray:
        """Cosine similarity [len(a), len(b)] of texts (embedded with `embed`'s defaults) or
        of [n, hidden] vectors."""
        a, b = self._vectors((a, "a"), (b, "b"))
        try:
            return vectors_lib.similarity(a, b)
        except ValueError as err:
            raise InferenceError(str(err)) from None

    def search(self, queries: Any, corpus: Any, top_k: int = 10) -> list[list[dict[str, Any]]]:
        """Per query, its top_k corpus entries by cosine similarity, best first, as
        sentence-transformers' semantic_search: [{"corpus_id": row, "score": cosine}, ...].

        queries and corpus are texts (embedded with `embed`'s defaults) or vectors; the
        search is exact (bertjax.inference.vectors.search).
        """
        top_k = as_int(top_k, "top_k", 1)
        queries, corpus = self._vectors((queries, "queries"), (corpus, "corpus"))
        try:
            scores, rows = vectors_lib.search(queries, corpus, top_k=top_k)
        except ValueError as err:
            raise InferenceError(str(err)) from None
        return [
            [{"corpus_id": int(r), "score": float(s)} for r, s in zip(row, score)]
            for row, score in zip(rows, scores)
        ]


# ----------------------------------------------------------------------------------------
# The jitted tasks: params and a padded batch in, numpy-ready outputs out.


@functools.partial(jax.jit, static_argnames=("config", "usable", "top_k", "packed_length"))
def _fill_mask(
    params, batch, *, config: EncoderConfig, usable: int, top_k: int, packed_length: int | None
):
    """Top-k probabilities and ids at masked_lm_positions: [b, p, k] each.

    Ids from `usable` on (rows of a vocabulary padded past the tokenizer's pieces) are never
    proposed; the softmax still spans every row, as transformers computes it.
    """
    logits = (
        encoders.family_of(config)
        .pretraining_model(config)
        .apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=True,
            packed_length=packed_length,
        )
        .mlm_logits
    )  # [b, p, v]
    probs = jax.nn.softmax(logits, axis=-1)  # [b, p, v] float32
    if usable < config.vocab_size:
        probs = jnp.where(jnp.arange(config.vocab_size) < usable, probs, -1.0)
    return jax.lax.top_k(probs, top_k)  # [b, p, k] scores, [b, p, k] ids


@functools.partial(jax.jit, static_argnames=("config", "pooling", "normalize", "packed_length"))
def _embed(
    params,
    batch,
    *,
    config: EncoderConfig,
    pooling: str,
    normalize: bool,
    packed_length: int | None,
):
    """One float32 vector per row: [b, h]."""
    sequence, pooled = (
        encoders.family_of(config)
        .module(config)
        .apply(
            {"params": params[capability_lib.ENCODER]},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            deterministic=True,
            packed_length=packed_length,
            # Only mean pooling reads the other positions: the rest skip them in the last layer.
            cls_only=pooling != "mean",
        )
    )  # [b, s or 1, h], [b, h]
    if pooling == "cls":
        vectors = sequence[:, 0].astype(jnp.float32)  # [b, h]
    elif pooling == "pooler":
        vectors = pooled.astype(jnp.float32)
    else:
        vectors = pooling_lib.mean(sequence, batch["input_mask"])  # [b, h]
    if normalize:
        norm = jnp.linalg.norm(vectors, axis=-1, keepdims=True)  # [b, 1]
        vectors = vectors / jnp.maximum(norm, 1e-12)
    return vectors


# ----------------------------------------------------------------------------------------
# Helpers


def as_texts(value: Any, name: str, *, need_words: bool = False) -> list[str]:
    """A notebook method's text argument as a non-empty list of str, or an InferenceError
    naming the argument. `need_words`: every text must hold more than whitespace."""
    with as_inference_error():
        texts = features_lib.as_texts(value, name)
    if need_words:
        for i, text in enumerate(texts):
            if not text.strip():
                what = name if isinstance(value, str) else f"{name}[{i}]"
                raise InferenceError(f"{what}={text!r} is empty; it needs some words")
    return texts


def _checked_vectors(texts_or_vectors: Any, name: str) -> np.ndarray | list[str]:
    """[n, h] float32 vectors, or a list of texts to embed; an InferenceError naming the
    argument when it is neither."""
    if not isinstance(texts_or_vectors, (np.ndarray, jax.Array)):
        return as_texts(texts_or_vectors, name)
    vectors = texts_or_vectors
    if vectors.ndim != 2 or 0 in vectors.shape:
        raise InferenceError(
            f"{name} has shape {tuple(vectors.shape)}: give [n, hidden] vectors "
            "(n, hidden >= 1), or texts"
        )
    if not np.issubdtype(vectors.dtype, np.number) or np.issubdtype(
        vectors.dtype, np.complexfloating
    ):
        raise InferenceError(f"{name} holds {vectors.dtype} values: give real numbers")
    vectors = np.asarray(vectors, np.float32)
    if not np.isfinite(vectors).all():
        row = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
        raise InferenceError(f"{name}[{row}] holds a NaN or infinite value")
    return vectors


def check_mesh(mesh: jax.sharding.Mesh | None) -> None:
    """A mesh has bertjax's axes (the logical rules map onto them), or is refused naming its."""
    if mesh is not None and set(mesh.axis_names) != set(sharding.MESH_AXES):
        raise InferenceError(
            f"mesh: its axes are {tuple(mesh.axis_names)}, bertjax's are "
            f"{sharding.MESH_AXES}; build one with bertjax.make_mesh((data, fsdp, tensor)), "
            "e.g. bertjax.make_mesh((-1, 1, 1)) for data parallelism over every device"
        )


def as_int(value: Any, name: str, low: int, high: int | None = None, why: str = "") -> int:
    """A notebook method's int argument in [low, high], or an InferenceError naming it
    (`why`: what the bounds come from)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InferenceError(f"{name}={value!r} is invalid: must be an int")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InferenceError(
            f"{name}={value!r} is invalid: must be an int {bounds}" + (f" ({why})" if why else "")
        )
    return int(value)


def as_bool(value: Any, name: str) -> bool:
    """A notebook method's flag, or an InferenceError naming it."""
    if not isinstance(value, (bool, np.bool_)):
        raise InferenceError(f"{name}={value!r} is invalid: must be True or False")
    return bool(value)


@contextlib.contextmanager
def as_inference_error():
    """Bad input found while encoding text is an InferenceError here."""
    try:
        yield
    except features_lib.InputError as err:
        raise InferenceError(str(err)) from None


@contextlib.contextmanager
def _export_errors(directory: str | os.PathLike):
    """An OSError while writing an export as an ExportError that names the directory."""
    try:
        yield
    except OSError as err:
        message = str(err.strerror or err)
        if str(directory) not in message:
            message = f"cannot write {directory}: {message}"
        error = ExportError(f"{message}; an export already there is left as it was")
        error.errno = err.errno
        raise error from None
