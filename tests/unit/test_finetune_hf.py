"""Fine-tuned models in and out of transformers' format: exports that load back whole, and
the helpers of tests/parity/test_finetune_hf_parity.py, where BertForSequenceClassification
and BertForTokenClassification give the same logits both ways."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from bertjax import heads, hf, optim
from bertjax.capability import HeadSpec
from bertjax.encoders.bert import transformers as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.finetune import loop
from bertjax.finetune.objective import build_finetuning
from bertjax.tasks.labels import model as label_heads
from bertjax.tokenizer import WordPieceTokenizer

ATOL = 1e-4
CONFIG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
)
IDS = np.array([[2, 17, 45, 3, 60, 3, 0, 0], [2, 80, 9, 31, 3, 0, 0, 0]], np.int32)
SEGMENTS = np.array([[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
MASK = (IDS > 0).astype(np.int32)
HEADS = {
    "classification": HeadSpec(label_heads.CLASSIFICATION, ("neg", "neutral", "pos")),
    "regression": HeadSpec(label_heads.REGRESSION, ("similarity",)),
    "multi_label": HeadSpec(label_heads.MULTI_LABEL, ("plot", "acting")),
    "token_classification": HeadSpec(
        label_heads.TOKEN_CLASSIFICATION, ("B-LOC", "B-PER", "I-PER", "O")
    ),
}


def random_params(head: HeadSpec, seed: int):
    """Every parameter random (biases and LayerNorm scales too, which a zero init would hide)."""
    model = label_heads.make_model(CONFIG, head.task, head.num_outputs)
    abstract = jax.eval_shape(lambda: heads.init_params(model, jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.normal(0, 0.2, leaf.shape).astype(np.float32)
        return 1.0 + noise if path[-1].key == "scale" else noise

    return jax.tree.map_with_path(fill, nn.meta.unbox(abstract))


def our_logits(head: HeadSpec, params) -> np.ndarray:
    model = label_heads.make_model(CONFIG, head.task, head.num_outputs)
    return np.asarray(jax.jit(model.apply)({"params": params}, IDS, SEGMENTS, MASK))


def test_a_save_and_load_round_trip_keeps_every_parameter(tmp_path):
    head = HEADS["multi_label"]
    params = random_params(head, seed=2)
    bert_hf.save(CONFIG, params, tmp_path, head=head)
    config, loaded, report = bert_hf.load_with_report(tmp_path)
    assert report.head == head and config == CONFIG
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_a_classifier_checkpoint_without_its_classifier_is_refused(tmp_path):
    head = HEADS["classification"]
    bert_hf.save(CONFIG, random_params(head, seed=3), tmp_path, head=head)
    tensors = safetensors_numpy.load_file(tmp_path / hf.SAFE_WEIGHTS_NAME)
    del tensors["classifier.bias"]
    safetensors_numpy.save_file(tensors, tmp_path / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing tensor 'classifier.bias'"):
        bert_hf.load_with_report(tmp_path)


@pytest.mark.parametrize("same_task", [True, False])
def test_fine_tuning_from_a_transformers_classifier_keeps_its_head_for_the_same_task(
    tmp_path, same_task
):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "w"]) + "\n")
    head = HEADS["classification"]
    params = random_params(head, seed=5)
    bert_hf.save(
        CONFIG, params, tmp_path / "export", WordPieceTokenizer.from_vocab(vocab), head=head
    )
    source = loop.open_source(tmp_path / "export")
    assert source.kind == "hf" and source.head == head

    run_head = head if same_task else HeadSpec(label_heads.CLASSIFICATION, ("no", "yes"))
    ft = build_finetuning(
        CONFIG,
        run_head,
        optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=1),
        mesh_shape=(-1, 1, 1),
        grad_accum_steps=1,
        micro_batch_size=8,
        max_seq_length=8,
    )
    fresh = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), ft.state.abstract.params)
    started, note, fresh_head = loop.initial_params(source, ft, fresh)
    assert fresh_head == (not same_task)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(started["bert"]), params["bert"])
    classifier = jax.device_get(started["classifier"])
    if same_task:
        jax.tree.map(np.testing.assert_array_equal, classifier, params["classifier"])
        assert "the encoder and the classification head" in note
    else:
        assert not classifier["kernel"].any()  # the run's own fresh head
        assert "is not this task's" in note


# ----------------------------------------------------------------------------- training parity
# Fine-tuning steps against transformers' classes trained by a plain torch loop: the same
# weights (every parameter random, head included, so google's truncated-normal and
# transformers' normal head initialisations do not enter), the same batches, dropout off, and
# google's optimizer on both sides (AdamW with BERT's decay mask: not on biases and LayerNorm;
# eps 1e-6, weight decay 0.01, clipping at global norm 1.0, linear warmup then linear decay).
# Both sides reduce the loss the same way: the mean over examples (regression: MSE; multi-label:
# the mean over example x label, as BCEWithLogitsLoss; token labels: the mean over labelled
# tokens, as CrossEntropyLoss with ignore_index).
#
# Tolerances: float32 on both sides, with XLA's and torch's summation orders. Over 20 steps at
# a learning rate of 1e-3 (50x google's, so that any difference in the update shows) the
# parameters measured differ by at most 7e-6 and the losses by 2e-6 relative; 1e-4 leaves
# room for other CPUs' kernels while a wrong decay mask, epsilon, clipping, schedule or loss
# reduction each moves parameters by about 1e-3 (one step of the learning rate) or more.
PARITY_STEPS, PARITY_BATCH, PARITY_SEQ, PARITY_LR = 20, 8, 16, 1e-3


def parity_batches(head: HeadSpec, pairs: bool, seed: int = 0) -> list[dict]:
    """Batches of random ids with lengths 4..16; pairs put the second half in segment 1."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(PARITY_STEPS):
        ids = np.zeros((PARITY_BATCH, PARITY_SEQ), np.int32)
        segments = np.zeros_like(ids)
        for row, length in enumerate(rng.integers(4, PARITY_SEQ + 1, PARITY_BATCH)):
            ids[row, :length] = rng.integers(5, CONFIG.vocab_size, length)
            ids[row, 0], ids[row, length - 1] = 2, 3  # [CLS] ... [SEP]
            if pairs:
                ids[row, length // 2 - 1] = 3
                segments[row, length // 2 : length] = 1
        mask = (ids > 0).astype(np.int32)
        batch = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
        batch["weights"] = np.ones(PARITY_BATCH, np.float32)
        if head.task == label_heads.REGRESSION:
            batch["labels"] = rng.uniform(0, 5, PARITY_BATCH).astype(np.float32)
        elif head.task == label_heads.CLASSIFICATION:
            batch["labels"] = rng.integers(0, head.num_outputs, PARITY_BATCH).astype(np.int32)
        elif head.task == label_heads.MULTI_LABEL:
            shape = (PARITY_BATCH, head.num_outputs)
            batch["labels"] = rng.integers(0, 2, shape).astype(np.float32)
        else:
            labels = rng.integers(0, head.num_outputs, ids.shape).astype(np.int32)
            labels[(mask == 0) | (ids == 2) | (ids == 3)] = label_heads.IGNORE_LABEL
            batch["labels"] = labels
        batches.append(batch)
    return batches
