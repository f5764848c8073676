"""Use a trained BERT: fill-mask, text embeddings and model inputs, from text.

`Model.load(path)` opens a bertjax work directory (its latest checkpoint, or `step=`), a
directory written by `bertjax.hf.save` or `Model.save_hf`, or a Hugging Face BERT directory
(config.json, model.safetensors or pytorch_model.bin, and tokenizer.json or vocab.txt)::

    m = bertjax.Model.load("runs/tiny")
    m.fill_mask("The [MASK] statement handles exceptions.")  # transformers' pipeline format
    m.embed(["first text", "second text"])                    # numpy [2, hidden]
    m.encode(["a question"], text_pairs=["a passage"])        # google's feature names

Batching: texts are sorted by length and cut into batches of `batch_size`; each batch is
padded to a bucket, its length to a power of two up to the model's position limit and its
rows to a power of two up to `batch_size`, so each bucket compiles once and every later
batch of that shape reuses it. With a mesh, batches are split over its (data, fsdp) axes and
parameters laid out by the model's logical axis rules; without one, everything runs on the
first device. Calls over many texts show a progress bar.

Input mistakes raise InferenceError with one message naming the text and what is wrong;
texts longer than the model's positions are cut, with a TruncationWarning naming the limit.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import tqdm.auto
from jax.experimental import multihost_utils

from bertjax import checkpoint as checkpoint_lib
from bertjax import embedding as embedding_lib
from bertjax import features as features_lib
from bertjax import fs, heads, hf, rundir, sbert
from bertjax import seq2seq as seq2seq_lib
from bertjax import sharding as sharding_lib
from bertjax.data import storage
from bertjax.data.sentences import split_sentences
from bertjax.features import TruncationWarning
from bertjax.model import BertConfig, BertForPreTraining, BertModel
from bertjax.tokenizer import Tokenizer

POOLINGS = ("mean", "cls", "pooler")
# The shortest length bucket: shorter batches would compile more shapes for no gain.
MIN_LENGTH_BUCKET = 8
# Calls over at least this many texts show a progress bar (when `progress` is None).
PROGRESS_MIN_TEXTS = 2048


class InferenceError(ValueError):
    """Input, or a directory, that inference cannot use; the message says what and why."""


def _next_power_of_two(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class Model:
    """A BERT with its tokenizer, ready for inference; see the module docstring.

    Build one with `Model.load(path)` or from pieces in memory: `Model(config, params,
    tokenizer)`, where params is BertForPreTraining's tree (plain or boxed, on the host or on
    devices). `dtype` overrides the compute dtype (e.g. "float32" for a model trained in
    bfloat16). `mesh` spreads batches and parameters over devices. A fine-tuned model has a
    `head` (bertjax.heads.HeadSpec), the parameter tree of bertjax.heads' models, and `predict`s.
    """

    def __init__(
        self,
        config: BertConfig,
        params: Any,
        tokenizer: Tokenizer,
        *,
        mesh: jax.sharding.Mesh | None = None,
        batch_size: int = 32,
        dtype: str | None = None,
        progress: bool | None = None,
        source: str = "memory",
        fresh_heads: Sequence[str] = (),
        head: heads.HeadSpec | None = None,
        embedding: embedding_lib.EmbeddingSpec | None = None,
    ):
        try:
            hf.check_vocab(config, tokenizer, source)
        except ValueError as err:
            raise InferenceError(str(err)) from None
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InferenceError(f"batch_size={batch_size!r} is invalid: must be an int >= 1")
        self.config = config
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.progress = progress
        self.source = source
        # Parameter groups the checkpoint did not have (freshly initialised by hf.load).
        self.fresh_heads = tuple(fresh_heads)
        # A fine-tuned model's task and labels; it has no pretraining heads to fill masks with.
        self.head = head
        # An embedding model's own pooling, normalisation and longest input: `embed`'s
        # defaults, and what save_hf writes as a sentence-transformers directory.
        if embedding is None and head is not None and head.task == embedding_lib.EMBEDDING_TASK:
            embedding = embedding_lib.EmbeddingSpec.from_labels(head.labels)
        self.embedding = embedding
        if head is not None or embedding is not None:
            self.fresh_heads = tuple(sorted({*self.fresh_heads, "mlm_head", "nsp_head"}))
        # Inference never needs rematerialisation; the compute dtype may be overridden.
        self._run_config = dataclasses.replace(
            config, dtype=dtype or config.dtype, remat_policy="none"
        )
        self._rows_multiple = 1 if mesh is None else sharding_lib.data_parallel_size(mesh)
        # Without a mesh, everything runs on this one device.
        self._device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        self.batch_size = _round_up(batch_size, self._rows_multiple)
        # An encoder-decoder (a seq2seq run or a transformers EncoderDecoderModel) generates.
        self._seq2seq = (
            seq2seq_lib.TaskOptions.from_head(head)
            if head is not None and head.task == seq2seq_lib.TASK
            else None
        )
        self.params = self._place(params)

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
        progress: bool | None = None,
    ) -> Model:
        """Opens a bertjax work directory, a bertjax export or a Hugging Face BERT directory.

        `step` picks a checkpoint of a work directory (default: the latest readable one).
        """
        overrides = {"dtype": dtype} if dtype else {}
        try:
            # Local or gs://: a missing bucket, no credentials or no permission is said here,
            # in one line naming the path.
            if fs.kind(path) is None:
                raise InferenceError(f"{path} does not exist")
            encoder_decoder = _is_encoder_decoder(path)
            sentence_transformers = step is None and sbert.is_sentence_transformers_dir(path)
        except fs.StorageError as err:
            raise InferenceError(str(err)) from None
        if encoder_decoder:  # a transformers EncoderDecoderModel directory
            return cls._load_encoder_decoder(path, mesh, batch_size, dtype, progress)
        if sentence_transformers:
            return cls._load_sentence_transformers(
                path, mesh=mesh, batch_size=batch_size, progress=progress, **overrides
            )
        try:
            run = rundir.open_run(path, step, **overrides)
            restored_step, params = rundir.read_params(run)
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
        return cls(
            run.config,
            params,
            run.tokenizer,
            mesh=mesh,
            batch_size=batch_size,
            dtype=dtype,
            progress=progress,
            source=source,
            fresh_heads=run.fresh,
            head=run.head,
        )

    def save_hf(self, directory: str | os.PathLike) -> None:
        """Writes a transformers directory: weights, config.json and the tokenizer files (an
        encoder-decoder's as transformers' EncoderDecoderModel, a question-answering model's as
        BertForQuestionAnswering); for an embedding model, a sentence-transformers directory
        (bertjax.sbert.save)."""
        if self._seq2seq is not None:
            config = self._seq2seq.config(self.config)
            with _as_inference_error():
                hf.save_seq2seq(config, self.params, directory, tokenizer=self.tokenizer)
            return
        if self.embedding is not None:
            with _as_inference_error():
                sbert.save(directory, self.config, self.params, self.tokenizer, self.embedding)
            return
        if self.answers_questions:  # transformers' BertForQuestionAnswering
            with _as_inference_error():
                hf.save(
                    self.config,
                    self.params,
                    directory,
                    tokenizer=self.tokenizer,
                    question_answering=True,
                )
            return
        # Heads this model never had (read from a BertModel directory) are not exported as
        # trained: the copy lacks them too, and refuses fill_mask as this one does.
        untrained = () if self.head is not None else self.fresh_heads
        with _as_inference_error():
            hf.save(
                self.config,
                self.params,
                directory,
                tokenizer=self.tokenizer,
                head=self.head,
                untrained=untrained,
            )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Model(BERT L{c.num_layers}/H{c.hidden_size}/A{c.num_heads}, "
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
        with _as_inference_error():
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
        if "mlm_head" in self.fresh_heads:
            raise InferenceError(
                f"{self.source} has no masked-LM head (cls.predictions.* in transformers' "
                "names), so it cannot fill masks; embed and encode work"
            )
        single = isinstance(text_or_texts, str)
        texts = _as_texts(text_or_texts, "text_or_texts")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise InferenceError(f"top_k={top_k!r} is invalid: must be an int >= 1")
        top_k = min(top_k, self.tokenizer.vocab_size)
        examples = self._examples(texts, None, None, mask_checked=True)
        results = []
        predictions = self._predict_masks([e.ids for e in examples], top_k)
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
        included, padding not), "cls" the output at [CLS], "pooler" BERT's tanh pooler on it.
        normalize: scale each vector to unit length. An embedding model (a trained embedding
        run, a sentence-transformers directory) embeds as it was trained when both are left
        out: its pooling ("max" too), normalisation and max_seq_length, empty texts included.
        """
        if self.embedding is not None and pooling is None and normalize is None:
            return self._embed_as_trained(texts)
        pooling = "mean" if pooling is None else pooling
        normalize = False if normalize is None else normalize
        if pooling not in POOLINGS:
            raise InferenceError(f"pooling={pooling!r} is invalid: choose one of {POOLINGS}")
        if pooling == "pooler" and "pooler" in self.fresh_heads:
            raise InferenceError(
                f"{self.source} has no pooler weights (bert.pooler.* in transformers' names); "
                "use pooling='mean' or 'cls'"
            )
        texts = _as_texts(texts, "texts")
        examples = self._examples(texts, None, None)
        function = self._function("embed", pooling=pooling, normalize=bool(normalize))
        out = np.zeros((len(examples), self.config.hidden_size), np.float32)
        for rows, vectors in self._run(function, [e.features() for e in examples]):
            out[rows] = vectors
        return out

    def predict(
        self,
        texts: str | Sequence[str],
        text_pairs: str | Sequence[str] | None = None,
        max_length: int | None = None,
    ) -> Any:
        """A fine-tuned model's predictions with their scores, per text (or pair).

        classification: {"label", "score"}, the most probable label and its probability;
        regression: {"label": the output's name, "score": the predicted value};
        multi_label: [{"label", "score"}, ...] for every label of probability >= 0.5, most
        probable first; token_classification: [{"word", "label", "score"}, ...] per word of
        the text split at whitespace (a word past max_length gets "O", or the first label,
        with score 0). One text gives one result, a list of texts a list of them.
        """
        head = self.head
        if head is None:
            raise InferenceError(
                f"{self.source} has no fine-tuning head: predict needs a run of finetune.py, "
                "or a transformers BertForSequenceClassification/BertForTokenClassification"
            )
        single = isinstance(texts, str)
        texts = _as_texts(texts, "texts")
        if head.token_level:
            if text_pairs is not None:
                raise InferenceError("token classification labels single texts: give no pairs")
            results = self._predict_words(texts, max_length)
        else:
            pairs = None if text_pairs is None else _as_texts(text_pairs, "text_pairs")
            if pairs is not None and len(pairs) != len(texts):
                raise InferenceError(
                    f"text_pairs has {len(pairs)} texts but texts has {len(texts)}; give one "
                    "pair per text"
                )
            examples = self._examples(texts, pairs, max_length)
            outputs = self._predict_rows([e.features() for e in examples])
            results = [_sequence_prediction(head, out) for out in outputs]
        return results[0] if single else results

    @property
    def answers_questions(self) -> bool:
        """Whether this is an extractive question-answering model (a qa_outputs head)."""
        return isinstance(self.params, dict) and hf.QA_OUTPUTS in self.params

    def answer(
        self,
        question: str | Sequence[str],
        context: str | Sequence[str],
        top_k: int = 1,
        **options: Any,
    ) -> dict | list:
        """Answers as transformers' question-answering pipeline returns them.

        Each answer is {"score", "start", "end", "answer"}: character offsets into the
        context and context[start:end]. A long context is windowed as the pipeline does
        (max_seq_len 384, doc_stride 128). One question gives a dict (top_k=1) or a list of
        top_k; a list of questions (one context, or one per question) a list of those.
        `options`: the pipeline's max_seq_len, doc_stride, max_question_len, max_answer_len,
        handle_impossible_answer, align_to_words. Needs a question-answering model: a
        fine-tuned question_answering run directory or a BertForQuestionAnswering one.
        """
        from bertjax.finetune import question_answering as qa  # the task's own module

        if not self.answers_questions:
            raise InferenceError(
                f"answer() needs a question-answering model; {self.source} has no qa_outputs "
                "head (load a question_answering run or a BertForQuestionAnswering directory)"
            )
        try:
            return qa.answer(
                self._run_config,
                self.params,
                self.tokenizer,
                question,
                context,
                top_k=top_k,
                **options,
            )
        except (ValueError, TypeError) as err:
            raise InferenceError(str(err)) from None

    def _predict_rows(self, features: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
        """The head's outputs (bertjax.heads.outputs) for each row of features, in order."""
        per_row: list[Any] = [None] * len(features)
        for rows, outputs in self._run(self._function("predict"), features):
            for k, row in enumerate(rows):
                per_row[row] = {name: values[k] for name, values in outputs.items()}
        return per_row

    def _predict_words(self, texts: list[str], max_length: int | None) -> list[list[dict]]:
        limit = self.config.max_position_embeddings
        max_length = limit if max_length is None else max_length
        if isinstance(max_length, bool) or not isinstance(max_length, int):
            raise InferenceError(f"max_length={max_length!r} is invalid: must be an int")
        if not 2 < max_length <= limit:
            raise InferenceError(f"max_length={max_length} is invalid: must be in [3, {limit}]")
        words = [text.split() for text in texts]
        for i, sentence in enumerate(words):
            if not sentence:
                raise InferenceError(
                    f"{features_lib.which(i, len(texts), 'text')} is empty; every text needs "
                    "some words"
                )
        inputs = heads.encode_words(self.tokenizer, words, max_length)
        lengths = inputs.input_mask.sum(axis=1)
        outputs = self._predict_rows(
            [
                {"input_ids": inputs.input_ids[r, :n], "segment_ids": inputs.segment_ids[r, :n]}
                for r, n in enumerate(lengths)
            ]
        )
        if inputs.words_cut:
            warnings.warn(
                f"{inputs.words_cut} word(s) lie past the limit of {max_length} tokens (or have "
                "no tokens) and get no prediction of their own",
                TruncationWarning,
                stacklevel=3,
            )
        labels = self.head.labels
        default = "O" if "O" in labels else labels[0]
        return [
            [
                {
                    "word": word,
                    "label": labels[out["labels"][p]] if p >= 0 else default,
                    "score": float(out["scores"][p]) if p >= 0 else 0.0,
                }
                for word, p in zip(sentence, where)
            ]
            for sentence, where, out in zip(words, inputs.word_positions, outputs)
        ]

    # ------------------------------------------------------------------------------------
    # Text to examples

    def _examples(
        self,
        texts: list[str],
        pairs: list[str] | None,
        max_length: int | None,
        mask_checked: bool = False,
    ) -> list[features_lib.Example]:
        limit = self.config.max_position_embeddings
        with _as_inference_error():
            return features_lib.inputs(
                self.tokenizer,
                texts,
                pairs,
                limit if max_length is None else max_length,
                limit=limit,
                need_mask=mask_checked,
            )

    def _token_ids(self, texts: list[str], what: str) -> list[list[int]]:
        with _as_inference_error():
            return features_lib.token_ids(self.tokenizer, texts, what)

    # ------------------------------------------------------------------------------------
    # Running the model

    def _predict_masks(
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
        function = self._function("fill_mask", top_k=top_k)
        scores: list[Any] = [None] * len(sequences)
        ids_out: list[Any] = [None] * len(sequences)
        for rows, (batch_scores, batch_ids) in self._run(function, features):
            for row, s, t in zip(rows, batch_scores, batch_ids):
                count = len(positions[row])
                scores[row], ids_out[row] = s[:count], t[:count]
        return list(zip(positions, scores, ids_out))

    def _function(self, kind: str, **static) -> Callable:
        """The task's jitted function with this model's static arguments bound.

        The jitted functions are shared by every Model, so a model loaded again, or another
        model of the same configuration, reuses what was compiled; jit compiles once per
        bucket shape.
        """
        if kind == "fill_mask":
            static["usable"] = self.tokenizer.vocab_size
        if kind == "predict":
            static["head"] = self.head
        return functools.partial(_TASKS[kind], config=self._run_config, **static)

    def _run(self, function: Callable, features: list[dict[str, np.ndarray]]) -> Iterator:
        """Yields (rows, outputs) per batch: the rows of `features` and numpy outputs for them.

        Batches are dispatched one ahead of reading their results back, so the host builds
        the next batch while the device computes.
        """
        pending: collections.deque = collections.deque()
        show = self.progress if self.progress is not None else len(features) >= PROGRESS_MIN_TEXTS
        bar = tqdm.auto.tqdm(
            total=len(features),
            unit="text",
            leave=False,
            disable=not show or jax.process_index() != 0,
        )
        try:
            for rows in self._batches(features):
                batch = _pad_batch([features[r] for r in rows], self._bucket(rows, features))
                with self._context():  # the mesh, for the model's sharding constraints
                    pending.append((rows, function(self.params, self._put(batch))))
                if len(pending) > 1:
                    rows_done, out = pending.popleft()
                    yield rows_done, self._fetch(out, len(rows_done))
                    bar.update(len(rows_done))
            while pending:
                rows_done, out = pending.popleft()
                yield rows_done, self._fetch(out, len(rows_done))
                bar.update(len(rows_done))
        finally:
            bar.close()

    def _batches(self, features: list[dict[str, np.ndarray]]) -> Iterator[np.ndarray]:
        """Row indices of each batch: longest texts first, so batches are of like lengths."""
        lengths = np.asarray([len(f["input_ids"]) for f in features])
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(order), self.batch_size):
            yield order[start : start + self.batch_size]

    def _bucket(self, rows: np.ndarray, features: list[dict[str, np.ndarray]]) -> dict[str, int]:
        """The padded shape of a batch: powers of two (rows a multiple of the data axes)."""
        longest = max(len(features[r]["input_ids"]) for r in rows)
        length = min(
            max(_next_power_of_two(longest), MIN_LENGTH_BUCKET), self.config.max_position_embeddings
        )
        count = _round_up(min(_next_power_of_two(len(rows)), self.batch_size), self._rows_multiple)
        shape = {"rows": count, "length": length}
        if "masked_lm_positions" in features[rows[0]]:
            most = max(len(features[r]["masked_lm_positions"]) for r in rows)
            shape["masks"] = _next_power_of_two(most)
        return shape

    def _context(self):
        if self.mesh is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(sharding_lib.LOGICAL_RULES))
        return stack

    def _place(self, params: Any) -> Any:
        """Parameters on this model's device(s): one device, or laid out on the mesh."""
        params = nn.meta.unbox(params)
        if isinstance(params, dict) and set(params) == {"params"}:
            params = params["params"]
        if self.mesh is None:
            return jax.device_put(params, self._device)
        if self._seq2seq is not None:
            init = seq2seq_lib.task_init(self._run_config, self.head)
            abstract = jax.eval_shape(init, jax.random.key(0))
            return jax.device_put(params, sharding_lib.logical_shardings(abstract, self.mesh))
        if self.embedding is not None:
            model = embedding_lib.make_model(self._run_config, self.embedding)
        elif self.head is None:
            model = BertForPreTraining(self._run_config)
        else:
            model = heads.make_model(self._run_config, self.head)
        ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
        # Shapes and logical axis names only; nothing is computed.
        abstract = jax.eval_shape(lambda key: model.init(key, ids)["params"], jax.random.key(0))
        shardings = sharding_lib.logical_shardings(abstract, self.mesh)
        return jax.device_put(params, shardings)

    def _put(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        if self.mesh is None:
            return jax.device_put(batch, self._device)
        rows = sharding_lib.batch_sharding(self.mesh)
        # Every process holds the whole batch and hands over the pieces its devices keep.
        return {
            name: jax.make_array_from_callback(array.shape, rows, lambda index, a=array: a[index])
            for name, array in batch.items()
        }

    def _fetch(self, out: Any, count: int) -> Any:
        def one(x):
            if not x.is_fully_addressable:
                x = multihost_utils.process_allgather(x, tiled=True)
            return np.asarray(x)[:count]

        return jax.tree.map(one, out)

    # ------------------------------------------------------------------------------------
    # Encoder-decoders

    @classmethod
    def _load_encoder_decoder(cls, path, mesh, batch_size, dtype, progress) -> Model:
        try:
            config, params = hf.load_seq2seq(path)
            tokenizer = hf.load_tokenizer(path)
        except (ValueError, FileNotFoundError, ImportError) as err:
            raise InferenceError(str(err)) from None
        options = seq2seq_lib.TaskOptions(
            decoder_start_id=config.decoder_start_id, eos_id=config.eos_id, init=config.init
        )
        return cls(
            config.bert,
            params,
            tokenizer,
            mesh=mesh,
            batch_size=batch_size,
            dtype=dtype,
            progress=progress,
            source=str(path),
            head=options.head(),
        )

    def generate(
        self,
        texts: str | Sequence[str],
        num_beams: int = 4,
        max_new_tokens: int = 64,
        *,
        length_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        early_stopping: bool | str = False,
        max_length: int | None = None,
    ) -> str | list[str]:
        """An encoder-decoder's generated text per source text (greedy with num_beams=1).

        The arguments mean what transformers' generate's do; sources longer than max_length
        tokens (default: the model's positions) are cut. One text gives one string.
        """
        if self._seq2seq is None:
            raise InferenceError(
                f"{self.source} is not an encoder-decoder: generate needs a seq2seq run of "
                "finetune.py or a transformers EncoderDecoderModel directory"
            )
        try:
            settings = seq2seq_lib.GenerationSettings(
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
                length_penalty=length_penalty,
                no_repeat_ngram_size=no_repeat_ngram_size,
                early_stopping=early_stopping,
            )
        except ValueError as err:
            raise InferenceError(str(err).replace("GenerationSettings.", "")) from None
        if max_new_tokens + 1 > self.config.max_position_embeddings:
            raise InferenceError(
                f"max_new_tokens={max_new_tokens} is invalid: the decoder has "
                f"{self.config.max_position_embeddings} positions, so at most "
                f"{self.config.max_position_embeddings - 1}"
            )
        single = isinstance(texts, str)
        texts = _as_texts(texts, "texts")
        features = [e.features() for e in self._examples(texts, None, max_length)]
        function = functools.partial(
            _generate, config=self._seq2seq.config(self._run_config), settings=settings
        )
        eos = self._seq2seq.eos_id
        results: list[Any] = [None] * len(texts)
        for rows, (tokens, lengths) in self._run(function, features):
            generated = seq2seq_lib.Generated(tokens, lengths, None)
            for row, ids in zip(rows, seq2seq_lib.strip(generated, eos)):
                results[row] = self.tokenizer.decode(ids, skip_special=True).strip()
        return results[0] if single else results

    # Embedding models: sentence-transformers directories and trained embedding runs

    @classmethod
    def _load_sentence_transformers(
        cls, path: str | os.PathLike, *, mesh, batch_size: int, progress, **overrides
    ) -> Model:
        try:
            loaded = sbert.load(path, **overrides)
        except (ValueError, FileNotFoundError, ImportError) as err:
            raise InferenceError(str(err)) from None
        return cls(
            loaded.config,
            loaded.params,
            loaded.tokenizer,
            mesh=mesh,
            batch_size=batch_size,
            progress=progress,
            source=str(path),
            embedding=loaded.spec,
        )

    def _embed_as_trained(self, texts: str | Sequence[str]) -> np.ndarray:
        """Texts embedded by the model's own EmbeddingSpec, as sentence-transformers does:
        cut to its max_seq_length, an empty text as [CLS] [SEP]."""
        texts = _as_texts(texts, "texts")
        with self._context():
            return embedding_lib.embed_texts(
                self._run_config,
                self.params,
                self.tokenizer,
                self.embedding,
                texts,
                batch_size=self.batch_size,
            )

    def _vectors(self, texts_or_vectors: Any) -> np.ndarray:
        if isinstance(texts_or_vectors, (np.ndarray, jax.Array)):
            return np.asarray(texts_or_vectors, np.float32)
        return self.embed(texts_or_vectors)

    def similarity(self, a: Any, b: Any) -> np.ndarray:
        """Cosine similarity [len(a), len(b)] of texts (embedded with `embed`'s defaults) or
        of [n, hidden] vectors."""
        return embedding_lib.similarity(self._vectors(a), self._vectors(b))

    def search(self, queries: Any, corpus: Any, top_k: int = 10) -> list[list[dict[str, Any]]]:
        """Per query, its top_k corpus entries by cosine similarity, best first, as
        sentence-transformers' semantic_search: [{"corpus_id": row, "score": cosine}, ...].

        queries and corpus are texts (embedded with `embed`'s defaults) or vectors; the
        search is exact (bertjax.embedding.search).
        """
        if isinstance(queries, str):
            queries = [queries]
        try:
            scores, rows = embedding_lib.search(
                self._vectors(queries), self._vectors(corpus), top_k=top_k
            )
        except ValueError as err:
            raise InferenceError(str(err)) from None
        return [
            [{"corpus_id": int(r), "score": float(s)} for r, s in zip(row, score)]
            for row, score in zip(rows, scores)
        ]


# ----------------------------------------------------------------------------------------
# The jitted tasks: params and a padded batch in, numpy-ready outputs out.


def _is_encoder_decoder(path: str | os.PathLike) -> bool:
    """Whether path is a transformers EncoderDecoderModel directory (its config.json says)."""
    config = fs.path(path) / hf.CONFIG_NAME
    if fs.kind(config) != "file":
        return False
    try:
        return json.loads(fs.read_text(config)).get("model_type") == "encoder-decoder"
    except fs.StorageError:
        raise
    except (OSError, ValueError, AttributeError):
        return False


def _generate(params, batch, *, config, settings):
    generated = seq2seq_lib.generate(
        config,
        params,
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        settings=settings,
    )
    return generated.tokens, generated.lengths


@functools.partial(jax.jit, static_argnames=("config", "usable", "top_k"))
def _fill_mask(params, batch, *, config: BertConfig, usable: int, top_k: int):
    """Top-k probabilities and ids at masked_lm_positions: [b, p, k] each.

    Ids from `usable` on (rows of a vocabulary padded past the tokenizer's pieces) are never
    proposed; the softmax still spans every row, as transformers computes it.
    """
    out = BertForPreTraining(config).apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        batch["masked_lm_positions"],
        deterministic=True,
    )
    probs = jax.nn.softmax(out.mlm_logits, axis=-1)  # [b, p, v] float32
    if usable < config.vocab_size:
        probs = jnp.where(jnp.arange(config.vocab_size) < usable, probs, -1.0)
    return jax.lax.top_k(probs, top_k)  # [b, p, k] scores, [b, p, k] ids


@functools.partial(jax.jit, static_argnames=("config", "pooling", "normalize"))
def _embed(params, batch, *, config: BertConfig, pooling: str, normalize: bool):
    """One float32 vector per row: [b, h]."""
    sequence, pooled = BertModel(config).apply(
        {"params": params["bert"]},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        deterministic=True,
        # Only mean pooling reads the other positions: the rest skip them in the last layer.
        cls_only=pooling != "mean",
    )  # [b, s or 1, h], [b, h]
    if pooling == "cls":
        vectors = sequence[:, 0].astype(jnp.float32)  # [b, h]
    elif pooling == "pooler":
        vectors = pooled.astype(jnp.float32)
    else:
        mask = batch["input_mask"][..., None].astype(jnp.float32)  # [b, s, 1]
        total = jnp.sum(sequence.astype(jnp.float32) * mask, axis=1)  # [b, h]
        vectors = total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
    if normalize:
        norm = jnp.linalg.norm(vectors, axis=-1, keepdims=True)  # [b, 1]
        vectors = vectors / jnp.maximum(norm, 1e-12)
    return vectors


@functools.partial(jax.jit, static_argnames=("config", "head"))
def _predict(params, batch, *, config: BertConfig, head: heads.HeadSpec):
    """What a fine-tuning head gives per row (bertjax.heads.outputs)."""
    logits = heads.make_model(config, head).apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        deterministic=True,
    )  # [b, labels] or [b, s, labels]
    return heads.outputs(head.task, logits)


_TASKS = {"fill_mask": _fill_mask, "embed": _embed, "predict": _predict}


# ----------------------------------------------------------------------------------------
# Helpers


def _as_texts(value: Any, name: str) -> list[str]:
    with _as_inference_error():
        return features_lib.as_texts(value, name)


@contextlib.contextmanager
def _as_inference_error():
    """Bad input found while encoding text is an InferenceError here."""
    try:
        yield
    except features_lib.InputError as err:
        raise InferenceError(str(err)) from None


def _sequence_prediction(head: heads.HeadSpec, out: dict[str, np.ndarray]) -> Any:
    """One text's prediction (see Model.predict) from its row of heads.outputs."""
    if head.task == heads.REGRESSION:
        return {"label": head.labels[0], "score": float(out["values"])}
    probabilities = out["probabilities"]
    if head.task == heads.MULTI_LABEL:
        chosen = np.flatnonzero(probabilities >= heads.MULTI_LABEL_THRESHOLD)
        chosen = sorted(chosen, key=lambda k: -probabilities[k])
        return [{"label": head.labels[k], "score": float(probabilities[k])} for k in chosen]
    best = int(np.argmax(probabilities))
    return {"label": head.labels[best], "score": float(probabilities[best])}


def _pad_batch(features: list[dict[str, np.ndarray]], shape: dict[str, int]) -> dict:
    """Stacks examples into [rows, length] arrays (and [rows, masks] positions), zero-padded.

    Padding rows are all zero: their outputs are computed and dropped.
    """
    rows, length = shape["rows"], shape["length"]
    batch = {
        "input_ids": np.zeros((rows, length), np.int32),
        "input_mask": np.zeros((rows, length), np.int32),
        "segment_ids": np.zeros((rows, length), np.int32),
    }
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        batch["input_ids"][row, :n] = f["input_ids"]
        batch["input_mask"][row, :n] = 1
        batch["segment_ids"][row, :n] = f["segment_ids"]
    if "masks" in shape:
        positions = np.zeros((rows, shape["masks"]), np.int32)
        for row, f in enumerate(features):
            positions[row, : len(f["masked_lm_positions"])] = f["masked_lm_positions"]
        batch["masked_lm_positions"] = positions
    return batch


# ----------------------------------------------------------------------------------------
# What the trainer prints at the end of a run


def held_out_texts(data_dir: str | os.PathLike, tokenizer: Tokenizer, count: int = 4) -> list[str]:
    """The first sentence of the first `count` evaluation instances of a prepared directory.

    The evaluation split holds documents the model was not trained on; each instance's
    first segment is decoded and its first sentence kept.
    """
    manifest = storage.read_manifest(data_dir)
    reader = storage.SplitReader(data_dir, "eval", manifest["splits"]["eval"]["shards"])
    texts: list[str] = []
    for i in range(len(reader)):
        if len(texts) == count:
            break
        length = int(reader.length[i])
        ids = reader.gather(np.asarray([i]), length)["input_ids"][0]  # [length]
        first_sep = int(np.argmax(ids == tokenizer.sep_id))
        sentences = split_sentences(tokenizer.decode(ids[1:first_sep], skip_special=True))
        if sentences and len(sentences[0].split()) >= 4:
            texts.append(sentences[0])
    return texts


def fill_mask_samples(
    config: BertConfig,
    params: Any,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    top_k: int = 3,
    mesh: jax.sharding.Mesh | None = None,
) -> list[str]:
    """Printable lines showing what a model predicts for a word hidden in each text.

    A text without [MASK] gets one whole word masked: a one-piece word of letters near the
    middle. Each line reads `<text with [MASK]>  ->  try 0.41 · for 0.12 · if 0.05  (was: with)`.
    """
    model = Model(config, params, tokenizer, mesh=mesh, progress=False)
    sequences, answers = [], []
    for ids in model._token_ids(list(texts), "text"):
        ids = [tokenizer.cls_id, *ids[: config.max_position_embeddings - 2], tokenizer.sep_id]
        answer = None
        if tokenizer.mask_id not in ids:
            position = _word_to_mask(ids, tokenizer)
            answer = _shown(tokenizer, ids[position])
            ids[position] = tokenizer.mask_id
        sequences.append(ids)
        answers.append(answer)
    lines = []
    for ids, answer, (_, scores, predicted) in zip(
        sequences, answers, model._predict_masks(sequences, top_k)
    ):
        guesses = " · ".join(
            f"{_shown(tokenizer, t)} {s:.2f}" for s, t in zip(scores[0], predicted[0])
        )
        line = f"{tokenizer.decode(ids[1:-1])}  ->  {guesses}"
        lines.append(line if answer is None else f"{line}  (was: {answer})")
    return lines


def _shown(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as text, or as its piece when that text is blank (sentencepiece's lone "▁")."""
    return tokenizer.decode([token_id]).strip() or tokenizer.id_to_piece(token_id)


def _word_to_mask(ids: list[int], tokenizer: Tokenizer) -> int:
    """The position to hide in [CLS] ... [SEP], nearest the middle among, by preference:
    one-piece words of three or more letters, other one-piece words, first pieces of words,
    any piece with text (not a lone "▁")."""
    starts = tokenizer.is_word_start

    def text(p: int) -> str:
        return tokenizer.decode([ids[p]]).strip()

    def whole_word(p: int) -> bool:
        return bool(starts[ids[p]] and starts[ids[p + 1]])  # the next piece starts a word

    inner = range(1, len(ids) - 1)
    middle = len(ids) // 2
    for wanted in (
        lambda p: whole_word(p) and len(text(p)) >= 3 and text(p).isalpha(),
        lambda p: whole_word(p) and text(p),
        lambda p: starts[ids[p]] and text(p),
        text,
        lambda p: True,
    ):
        candidates = [p for p in inner if wanted(p)]
        if candidates:
            return min(candidates, key=lambda p: abs(p - middle))
    raise ValueError("a text of [CLS] and [SEP] alone has nothing to hide")
