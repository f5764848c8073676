"""Fine-tuned models in and out of transformers: BertForSequenceClassification and
BertForTokenClassification load with nothing missing and give the same logits, both ways."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import numpy as safetensors_numpy

import bertjax
from bertjax import heads, hf, optim
from bertjax.finetune import loop
from bertjax.finetune.objective import build_finetuning
from bertjax.model import BertConfig
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
    "classification": heads.HeadSpec(heads.CLASSIFICATION, ("neg", "neutral", "pos")),
    "regression": heads.HeadSpec(heads.REGRESSION, ("similarity",)),
    "multi_label": heads.HeadSpec(heads.MULTI_LABEL, ("plot", "acting")),
    "token_classification": heads.HeadSpec(
        heads.TOKEN_CLASSIFICATION, ("B-LOC", "B-PER", "I-PER", "O")
    ),
}
HF_CLASSES = {
    heads.TOKEN_CLASSIFICATION: transformers.BertForTokenClassification,
    heads.CLASSIFICATION: transformers.BertForSequenceClassification,
}


def random_params(head: heads.HeadSpec, seed: int):
    """Every parameter random (biases and LayerNorm scales too, which a zero init would hide)."""
    model = heads.make_model(CONFIG, head)
    abstract = jax.eval_shape(lambda: heads.init_params(model, jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.normal(0, 0.2, leaf.shape).astype(np.float32)
        return 1.0 + noise if path[-1].key == "scale" else noise

    return jax.tree.map_with_path(fill, nn.meta.unbox(abstract))


def our_logits(head: heads.HeadSpec, params) -> np.ndarray:
    model = heads.make_model(CONFIG, head)
    return np.asarray(jax.jit(model.apply)({"params": params}, IDS, SEGMENTS, MASK))


def torch_logits(model) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(IDS, dtype=torch.long),
            token_type_ids=torch.tensor(SEGMENTS, dtype=torch.long),
            attention_mask=torch.tensor(MASK, dtype=torch.long),
        )
    return out.logits.numpy()


@pytest.mark.parametrize("name", list(HEADS))
def test_exported_heads_load_in_transformers_with_equal_logits(tmp_path, name):
    head = HEADS[name]
    params = random_params(head, seed=1)
    hf.save(CONFIG, params, tmp_path, head=head)
    cls = HF_CLASSES.get(head.task, transformers.BertForSequenceClassification)
    model, info = cls.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"]
    config = model.config
    assert config.id2label == dict(enumerate(head.labels))
    assert config.label2id == {label: i for i, label in enumerate(head.labels)}
    if head.task != heads.TOKEN_CLASSIFICATION:
        assert config.problem_type == heads.HF_PROBLEM_TYPES[head.task]
    model.eval()
    ours, theirs = our_logits(head, params), torch_logits(model)
    if head.token_level:  # padding positions compute garbage on both sides: compare the rest
        ours, theirs = ours[MASK == 1], theirs[MASK == 1]
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["classification", "token_classification", "regression"])
def test_transformers_heads_import_with_equal_logits(tmp_path, name):
    head = HEADS[name]
    cls = HF_CLASSES.get(head.task, transformers.BertForSequenceClassification)
    hf_config = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        id2label=dict(enumerate(head.labels)),
        attn_implementation="eager",
    )
    if head.task == heads.REGRESSION:
        hf_config.problem_type = None  # one label and no problem_type: transformers' regression
    torch.manual_seed(0)
    model = cls(hf_config).eval()
    with torch.no_grad():  # every parameter random, so that a swapped bias or scale shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(tmp_path)

    config, params, report = hf.load_with_report(tmp_path)
    assert report.head == head
    assert set(params) == {"bert", "classifier"}
    if head.token_level:  # BertForTokenClassification has no pooler: bertjax starts one
        assert report.initialized == ("bert/pooler/kernel", "bert/pooler/bias")
    else:
        assert report.initialized == ()
    ours, theirs = our_logits(head, jax.tree.map(jnp.asarray, params)), torch_logits(model)
    if head.token_level:
        ours, theirs = ours[MASK == 1], theirs[MASK == 1]
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


def test_a_save_and_load_round_trip_keeps_every_parameter(tmp_path):
    head = HEADS["multi_label"]
    params = random_params(head, seed=2)
    hf.save(CONFIG, params, tmp_path, head=head)
    config, loaded, report = hf.load_with_report(tmp_path)
    assert report.head == head and config == CONFIG
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_a_classifier_checkpoint_without_its_classifier_is_refused(tmp_path):
    head = HEADS["classification"]
    hf.save(CONFIG, random_params(head, seed=3), tmp_path, head=head)
    tensors = safetensors_numpy.load_file(tmp_path / hf.SAFE_WEIGHTS_NAME)
    del tensors["classifier.bias"]
    safetensors_numpy.save_file(tensors, tmp_path / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing tensor 'classifier.bias'"):
        hf.load_with_report(tmp_path)


def test_an_exported_classifier_predicts_as_transformers_does(tmp_path):
    words = [f"w{i}" for i in range(99 - 5)]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    head = HEADS["classification"]
    hf.save(CONFIG, random_params(head, seed=4), tmp_path / "export", tokenizer, head=head)

    model = bertjax.Model.load(tmp_path / "export")
    texts, pairs = ["w1 w2 w3", "w40 w7"], ["w5 w6", "w8 w9 w10 w11"]
    predictions = model.predict(texts, pairs)
    reference = transformers.BertForSequenceClassification.from_pretrained(
        tmp_path / "export", attn_implementation="eager"
    ).eval()
    inputs = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")(
        texts, pairs, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        probabilities = torch.softmax(reference(**inputs).logits, dim=-1).numpy()
    assert [p["label"] for p in predictions] == [
        reference.config.id2label[k] for k in probabilities.argmax(axis=-1)
    ]
    np.testing.assert_allclose(
        [p["score"] for p in predictions], probabilities.max(axis=-1), atol=ATOL
    )


@pytest.mark.parametrize("same_task", [True, False])
def test_fine_tuning_from_a_transformers_classifier_keeps_its_head_for_the_same_task(
    tmp_path, same_task
):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "w"]) + "\n")
    head = HEADS["classification"]
    params = random_params(head, seed=5)
    hf.save(CONFIG, params, tmp_path / "export", WordPieceTokenizer.from_vocab(vocab), head=head)
    source = loop.open_source(tmp_path / "export")
    assert source.kind == "hf" and source.head == head

    run_head = head if same_task else heads.HeadSpec(heads.CLASSIFICATION, ("no", "yes"))
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
    started, note = loop.initial_params(source, ft, fresh)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(started["bert"]), params["bert"])
    classifier = jax.device_get(started["classifier"])
    if same_task:
        jax.tree.map(np.testing.assert_array_equal, classifier, params["classifier"])
        assert "the encoder and the classification head" in note
    else:
        assert not classifier["kernel"].any()  # the run's own fresh head
        assert "is not this task's" in note
