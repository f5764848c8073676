"""The label heads: classification, regression, multi-label and token labels.

A label model is the encoder of the config's family (parameters under capability.ENCODER)
plus the family's head named "classifier" (EncoderFamily.head: its module and tensor map), with
the head's dropout before it (BERT: the config's hidden_dropout, 0.1, google's and
transformers' rate; ELECTRA: classifier_rate; ModernBERT's encoder applies classifier_dropout
after its prediction head):

  classification        pooled output -> [batch, labels] logits, softmax cross-entropy
                        (one sentence or a pair; a pair is one [CLS] A [SEP] B [SEP] input)
  regression            pooled output -> [batch, 1], mean squared error
  multi_label           pooled output -> [batch, labels] logits, sigmoid binary cross-entropy
                        per label; a label is predicted when its probability is >= 0.5
  token_classification  sequence output -> [batch, seq, labels], cross-entropy at labelled
                        positions: the first sub-word of each word carries the word's tag,
                        the other sub-words, [CLS], [SEP] and padding carry IGNORE_LABEL

`HeadSpec` names the task and its labels; it travels in checkpoint meta and in transformers'
config.json (id2label).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability, encoders
from bertjax.capability import ENCODER
from bertjax.encoders.bert.model import Dropout
from bertjax.encoders.family import EncoderConfig
from bertjax.nn import distillation, sharding
from bertjax.nn.heads import CLASSIFIER, HeadSums
from bertjax.nn.sharding import ACTIVATION_EMBED, BATCH, LABELS, LENGTH
from bertjax.text.tokenizer import Tokenizer

CLASSIFICATION = "classification"
REGRESSION = "regression"
MULTI_LABEL = "multi_label"
TOKEN_CLASSIFICATION = "token_classification"
TASKS = (CLASSIFICATION, REGRESSION, MULTI_LABEL, TOKEN_CLASSIFICATION)

MULTI_LABEL_THRESHOLD = 0.5
# Token positions that carry no label: continuation sub-words, [CLS], [SEP], padding.
IGNORE_LABEL = -1


def check_labels(task: str, labels: tuple[str, ...]) -> None:
    """Raises ValueError unless `labels` suit a head of `task` (one of TASKS)."""
    if task == REGRESSION and len(labels) != 1:
        raise ValueError(f"a regression head has one output; got labels={labels!r}")
    if task in (CLASSIFICATION, TOKEN_CLASSIFICATION) and len(labels) < 2:
        raise ValueError(
            f"a {task} head needs at least 2 labels; got {labels!r} (the training "
            "data holds a single label)"
        )
    if task == MULTI_LABEL and not labels:
        raise ValueError("a multi_label head needs at least 1 label")


class SequenceClassifier(nn.Module):
    """The encoder's pooled output -> dropout -> dense: [batch, num_outputs] float32 logits."""

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ) -> jax.Array:
        _, pooled = encoders.family_of(self.config).module(self.config, name=ENCODER)(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            cls_only=True,  # the pooled output reads only [CLS]
        )  # [b, h]
        head = encoders.family_of(self.config).head(
            self.config, CLASSIFIER, self.num_outputs, capability.POOLED
        )
        pooled = Dropout(head.dropout)(pooled, deterministic=deterministic)
        logits = head.module(pooled)  # [b, labels]
        return sharding.constrain(logits, (BATCH, LABELS))


class TokenClassifier(nn.Module):
    """The encoder's per-token output -> dropout -> dense: [batch, seq, num_outputs] logits."""

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ) -> jax.Array:
        family = encoders.family_of(self.config)
        sequence, _ = family.module(self.config, name=ENCODER)(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            token_head=True,
        )  # [b, s, h]
        head = family.head(self.config, CLASSIFIER, self.num_outputs, capability.TOKENS)
        sequence = sharding.constrain(
            Dropout(head.dropout)(sequence, deterministic=deterministic),
            (BATCH, LENGTH, ACTIVATION_EMBED),
        )
        logits = head.module(sequence)  # [b, s, labels]
        return sharding.constrain(logits, (BATCH, LENGTH, LABELS))


def make_model(config: EncoderConfig, task: str, num_outputs: int) -> nn.Module:
    """The linen module of a label head: TokenClassifier for token labels, else
    SequenceClassifier."""
    cls = TokenClassifier if task == TOKEN_CLASSIFICATION else SequenceClassifier
    return cls(config, num_outputs)


# ----------------------------------------------------------------------------- losses


def classification_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> HeadSums:
    """Softmax cross-entropy of [b, C] logits against int [b] labels; weight 0 drops a row."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, C]
    is_label = labels[:, None] == jnp.arange(logits.shape[-1])  # [b, C]
    loss = -jnp.sum(jnp.where(is_label, log_probs, 0.0), axis=-1)  # [b]
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)  # [b]
    weights = weights.astype(jnp.float32)
    return HeadSums(jnp.sum(weights * loss), jnp.sum(weights * correct), jnp.sum(weights))


def regression_sums(outputs: jax.Array, targets: jax.Array, weights: jax.Array) -> HeadSums:
    """Squared error of [b, 1] outputs against float [b] targets (the mean is MSE)."""
    error = outputs[:, 0].astype(jnp.float32) - targets.astype(jnp.float32)  # [b]
    weights = weights.astype(jnp.float32)
    return HeadSums(jnp.sum(weights * error**2), jnp.zeros((), jnp.float32), jnp.sum(weights))


def multi_label_sums(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> HeadSums:
    """Binary cross-entropy of [b, L] logits against 0/1 [b, L] targets, summed over labels.

    The count is examples x labels, so loss / count is the mean over every (example, label),
    as torch's BCEWithLogitsLoss computes it.
    """
    x = logits.astype(jnp.float32)
    z = targets.astype(jnp.float32)
    loss = -(z * jax.nn.log_sigmoid(x) + (1.0 - z) * jax.nn.log_sigmoid(-x))  # [b, L]
    # sigmoid(x) >= 0.5 exactly when x >= 0.
    hits = ((x >= 0.0) == (z >= 0.5)).astype(jnp.float32)  # [b, L]
    w = weights.astype(jnp.float32)[:, None]  # [b, 1]
    return HeadSums(jnp.sum(w * loss), jnp.sum(w * hits), jnp.sum(w) * logits.shape[-1])


def token_classification_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> HeadSums:
    """Cross-entropy of [b, s, C] logits at positions whose int [b, s] label is not ignored;
    weight 0 drops a row."""
    labelled = (labels != IGNORE_LABEL) & (weights[:, None] > 0)  # [b, s]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, s, C]
    is_label = labels[..., None] == jnp.arange(logits.shape[-1])  # [b, s, C]
    loss = -jnp.sum(jnp.where(is_label, log_probs, 0.0), axis=-1)  # [b, s]
    correct = jnp.argmax(logits, axis=-1) == labels  # [b, s]
    mask = labelled.astype(jnp.float32)
    return HeadSums(jnp.sum(mask * loss), jnp.sum(mask * correct), jnp.sum(mask))


def head_sums(task: str, logits: jax.Array, batch) -> HeadSums:
    """The task's loss statistics of one batch (features: labels, and weights per row)."""
    if task == CLASSIFICATION:
        return classification_sums(logits, batch["labels"], batch["weights"])
    if task == REGRESSION:
        return regression_sums(logits, batch["labels"], batch["weights"])
    if task == MULTI_LABEL:
        return multi_label_sums(logits, batch["labels"], batch["weights"])
    return token_classification_sums(logits, batch["labels"], batch["weights"])


def denominator(task: str, batch, num_outputs: int) -> jax.Array:
    """`HeadSums.count` of a whole batch, from its features alone."""
    if task == TOKEN_CLASSIFICATION:
        labelled = (batch["labels"] != IGNORE_LABEL) & (batch["weights"][:, None] > 0)
        return jnp.sum(labelled.astype(jnp.float32))
    rows = jnp.sum(batch["weights"].astype(jnp.float32))
    return rows * num_outputs if task == MULTI_LABEL else rows


def soft_sums(
    task: str, student: jax.Array, teacher: jax.Array, batch, temperature: float
) -> tuple[jax.Array, jax.Array]:
    """(summed soft loss of the student's logits against the teacher's, its count): every row
    of a training batch counts, labelled or not (bertjax.finetune.distill).

    classification: softened KL per row; regression: squared error to the teacher's score;
    multi-label: each label's softened Bernoulli KL, averaged over (row, label) as the hard
    loss is; token labels: softened KL at every real position."""
    if task == TOKEN_CLASSIFICATION:
        mask = batch["input_mask"].astype(jnp.float32)  # [b, s]
        per_token = distillation.soft_cross_entropy(student, teacher, temperature)  # [b, s]
        return jnp.sum(mask * per_token), jnp.sum(mask)
    if task == REGRESSION:
        per_row = distillation.squared_error(student, teacher)  # [b]
    elif task == MULTI_LABEL:
        per_row = distillation.soft_binary_cross_entropy(student, teacher, temperature)  # [b]
    else:
        per_row = distillation.soft_cross_entropy(student, teacher, temperature)  # [b]
    return jnp.sum(per_row), soft_denominator(task, batch, student.shape[-1])


def soft_denominator(task: str, batch, num_outputs: int) -> jax.Array:
    """`soft_sums`' count of a whole batch, from its features alone."""
    if task == TOKEN_CLASSIFICATION:
        return jnp.sum(batch["input_mask"].astype(jnp.float32))
    rows = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)
    return rows * num_outputs if task == MULTI_LABEL else rows


def outputs(task: str, logits: jax.Array) -> dict[str, jax.Array]:
    """What evaluation and prediction read from the logits, per task.

    classification: probabilities [b, C]; regression: values [b]; multi-label: per-label
    probabilities [b, L]; token classification: the best label [b, s] and its probability.
    """
    if task == CLASSIFICATION:
        return {"probabilities": jax.nn.softmax(logits, axis=-1)}
    if task == REGRESSION:
        return {"values": logits[:, 0]}
    if task == MULTI_LABEL:
        return {"probabilities": jax.nn.sigmoid(logits)}
    probabilities = jax.nn.softmax(logits, axis=-1)  # [b, s, C]
    return {
        "labels": jnp.argmax(logits, axis=-1).astype(jnp.int32),  # [b, s]
        "scores": jnp.max(probabilities, axis=-1),  # [b, s]
    }


# ----------------------------------------------------------------------------- token inputs


@dataclasses.dataclass(frozen=True)
class WordInputs:
    """Token-classification inputs: [n, seq] arrays and where each word's label goes."""

    input_ids: np.ndarray  # [n, seq] int32: [CLS] sub-words [SEP] then padding
    input_mask: np.ndarray  # [n, seq] int32
    segment_ids: np.ndarray  # [n, seq] int32, all 0
    # Per sentence, the position of each word's first sub-word; -1 for a word that was cut
    # (past max_seq_length) or that the tokenizer reduced to nothing.
    word_positions: list[np.ndarray]
    words_cut: int  # how many words (in all) had no position


def encode_words(
    tokenizer: Tokenizer, sentences: Sequence[Sequence[str]], max_seq_length: int
) -> WordInputs:
    """[CLS] w1 w2 ... [SEP] for sentences given as words, each word tokenized on its own.

    Sentences longer than max_seq_length sub-words lose their last words; those words get
    position -1.
    """
    flat = [word for sentence in sentences for word in sentence]
    pieces = iter(tokenizer.encode_words(flat))
    n = len(sentences)
    input_ids = np.zeros((n, max_seq_length), np.int32)
    input_mask = np.zeros((n, max_seq_length), np.int32)
    positions, words_cut = [], 0
    budget = max_seq_length - 1  # room before the final [SEP]
    for row, sentence in enumerate(sentences):
        ids = [tokenizer.cls_id]
        where = np.full(len(sentence), -1, np.int64)
        for k in range(len(sentence)):
            word = next(pieces)
            if word and len(ids) + len(word) <= budget:
                where[k] = len(ids)
                ids += word
            elif word and len(ids) < budget:  # the first sub-words still fit: keep the label
                where[k] = len(ids)
                ids += word[: budget - len(ids)]
        ids.append(tokenizer.sep_id)
        words_cut += int(np.sum(where < 0))
        input_ids[row, : len(ids)] = ids
        input_mask[row, : len(ids)] = 1
        positions.append(where)
    return WordInputs(input_ids, input_mask, np.zeros_like(input_ids), positions, words_cut)
