"""bertjax.Model: fill-mask, embeddings and inputs from text, checked against transformers.

Two models go both ways between bertjax and transformers: one bertjax trains (a short run on a
synthetic corpus, saved as a work directory: the `workdir` fixture of
tests/unit/test_inference_unit.py) and a random transformers BERT with a WordPiece vocab.txt,
as published BERTs come.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest
import torch
import transformers
from safetensors import numpy as safetensors_numpy

from bertjax.inference import InferenceError, Model, TruncationWarning
from bertjax.text.training import TokenizerSettings, train_tokenizer
from tests.helpers.inference import (  # noqa: F401 (fixtures)
    ATOL,
    MASKED,
    _assert_same_predictions,
    held_out,
    trained,
    workdir,
)
from tests.helpers.tokenizer import VARIED, training_sentences, write_wordpiece_vocab
from tests.helpers.torch_params import randomize_torch


@pytest.fixture(scope="module")
def wordpiece_hf_dir(tmp_path_factory) -> pathlib.Path:
    """A published-style BERT directory: config.json, model.safetensors, vocab.txt (uncased)."""
    directory = tmp_path_factory.mktemp("hf_bert")
    vocab = write_wordpiece_vocab(
        directory / "vocab.txt", [s.lower() for s in VARIED] * 3 + SENTENCES, lowercase=True
    )
    size = len(vocab.read_text(encoding="utf-8").splitlines())
    config = transformers.BertConfig(
        vocab_size=size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    randomize_torch(transformers.BertForPreTraining(config), seed=1).save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return directory


@pytest.fixture(scope="module")
def wordpiece(wordpiece_hf_dir) -> Model:
    return Model.load(wordpiece_hf_dir)


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "A statement is executed once for each item in the sequence.",
    "Machine learning models learn patterns from data.",
    "She sells sea shells by the sea shore.",
    "The function returns a new list with the results.",
]


def _loading_info(cls, directory):
    _, info = cls.from_pretrained(directory, output_loading_info=True)
    return {k: sorted(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys")}


# ---------------------------------------------------------------------------------------------
# A model bertjax trained: workdir -> Model -> transformers -> Model


def test_trained_model_export_matches_transformers_pipeline(trained, held_out, tmp_path):
    model = trained
    model.save_hf(tmp_path)
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path))
    # Held-out text of the corpus it learned, its third word hidden, and some English.
    words = [text.split() for text in held_out]
    texts = [" ".join([*w[:2], "[MASK]", *w[3:]]) for w in words] + MASKED
    for text in texts:
        _assert_same_predictions([model.fill_mask(text)], [pipe(text, top_k=5)])
    # The batched call gives what one text at a time gives.
    batched = model.fill_mask(texts)
    for text, result in zip(texts, batched):
        _assert_same_predictions([result], [model.fill_mask(text)])


def test_export_loads_in_transformers_with_nothing_missing(trained, tmp_path):
    trained.save_hf(tmp_path)
    assert _loading_info(transformers.BertForPreTraining, tmp_path) == {
        "missing_keys": [],
        "unexpected_keys": [],
    }
    # The masked-LM class has no pooler and no next-sentence head: transformers reports
    # those two as unused, exactly as for Google's pretraining checkpoints.
    assert _loading_info(transformers.AutoModelForMaskedLM, tmp_path) == {
        "missing_keys": [],
        "unexpected_keys": [
            "bert.pooler.dense.bias",
            "bert.pooler.dense.weight",
            "cls.seq_relationship.bias",
            "cls.seq_relationship.weight",
        ],
    }


# ---------------------------------------------------------------------------------------------
# A transformers BERT with a WordPiece vocab.txt: HF dir -> Model -> export -> transformers


def test_hf_wordpiece_model_matches_transformers(wordpiece_hf_dir, wordpiece):
    model = wordpiece
    assert model.tokenizer.kind == "wordpiece" and model.tokenizer.mask_id == 13
    pipe = transformers.pipeline("fill-mask", model=str(wordpiece_hf_dir))
    for text in MASKED + ["Tokyo is in [MASK]. Ünïcödé façade 🙂 https://x.org/[MASK]"]:
        ours, theirs = model.fill_mask(text), pipe(text, top_k=5)
        if isinstance(ours[0], dict):
            ours, theirs = [ours], [theirs]
        _assert_same_predictions(ours, theirs)


def test_hf_wordpiece_model_export_round_trip(wordpiece_hf_dir, wordpiece, tmp_path):
    model = wordpiece
    model.save_hf(tmp_path)
    for name in ("model.safetensors",):
        before = safetensors_numpy.load_file(wordpiece_hf_dir / name)
        after = safetensors_numpy.load_file(tmp_path / name)
        assert before.keys() == after.keys()
        for key in before:
            np.testing.assert_array_equal(before[key], after[key], err_msg=key)
    source = transformers.BertTokenizerFast.from_pretrained(wordpiece_hf_dir)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path)
    corpus = VARIED + SENTENCES + MASKED
    assert exported(corpus)["input_ids"] == source(corpus)["input_ids"]
    assert (
        exported(corpus[:3], corpus[3:6])["token_type_ids"]
        == source(corpus[:3], corpus[3:6])["token_type_ids"]
    )
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path))
    _assert_same_predictions([pipe(MASKED[0], top_k=5)], [model.fill_mask(MASKED[0])])
    assert Model.load(tmp_path).tokenizer.fingerprint == model.tokenizer.fingerprint


def test_several_masks_in_one_text(wordpiece_hf_dir, wordpiece):
    model = wordpiece
    pipe = transformers.pipeline("fill-mask", model=str(wordpiece_hf_dir))
    text = "The [MASK] brown fox jumps over the [MASK] dog."
    ours, theirs = model.fill_mask(text, top_k=3), pipe(text, top_k=3)
    assert len(ours) == 2 and all(len(row) == 3 for row in ours)
    _assert_same_predictions(ours, theirs)
    assert "[MASK]" in ours[0][0]["sequence"]  # the other mask stays visible


def test_embed_matches_transformers_bert_model(wordpiece_hf_dir, wordpiece):
    model = wordpiece
    torch_model = transformers.BertModel.from_pretrained(wordpiece_hf_dir).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(wordpiece_hf_dir)
    texts = SENTENCES + VARIED[:6]
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = torch_model(**inputs)
    mask = inputs["attention_mask"][..., None].float()
    expected = {
        "mean": ((out.last_hidden_state * mask).sum(1) / mask.sum(1)).numpy(),
        "cls": out.last_hidden_state[:, 0].numpy(),
        "pooler": out.pooler_output.numpy(),
    }
    for pooling, want in expected.items():
        got = model.embed(texts, pooling=pooling)
        assert got.shape == (len(texts), 32) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=pooling)
    unit = model.embed(texts, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(unit, want_normalized(expected["mean"]), atol=ATOL, rtol=0)
    # Padding-aware: a text alone equals the same text in a padded batch.
    np.testing.assert_allclose(model.embed(texts[0]), model.embed(texts)[:1], atol=1e-5, rtol=0)


def want_normalized(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_encode_uses_google_names_and_truncates_pairs_longest_first(wordpiece):
    model = wordpiece
    tok = model.tokenizer
    out = model.encode(["hello world", "a"], text_pairs=["the sea", "b c"])
    assert set(out) == {"input_ids", "input_mask", "segment_ids"}
    a, b = tok.encode("hello world"), tok.encode("the sea")
    row = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
    assert out["input_ids"][0].tolist() == row + [0] * (out["input_ids"].shape[1] - len(row))
    assert out["segment_ids"][0, : len(row)].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    second = 3 + len(tok.encode("a")) + len(tok.encode("b c"))
    assert out["input_mask"].sum(1).tolist() == [len(row), second]
    assert out["input_ids"].shape == (2, len(row))
    # google's longest-first: 10 + 4 tokens into 12 - 3 = 9 slots keeps 5 + 4; 3 + 12 keeps 3 + 6.
    sea = tok.encode("sea")
    assert len(sea) == 1
    words = lambda n: " ".join(["sea"] * n)  # noqa: E731
    with pytest.warns(TruncationWarning, match="limit of 12 tokens"):
        cut = model.encode([words(10), words(3)], text_pairs=[words(4), words(12)], max_length=12)
    assert cut["input_ids"].tolist() == [
        [tok.cls_id, *sea * 5, tok.sep_id, *sea * 4, tok.sep_id],
        [tok.cls_id, *sea * 3, tok.sep_id, *sea * 6, tok.sep_id],
    ]
    assert cut["segment_ids"][1].tolist() == [0] * 5 + [1] * 7


# ---------------------------------------------------------------------------------------------
# Batching, buckets and devices


# ---------------------------------------------------------------------------------------------
# Bad input: one InferenceError naming the problem


def test_bad_directories(workdir, wordpiece_hf_dir, tmp_path):
    with pytest.raises(InferenceError, match="does not exist"):
        Model.load(tmp_path / "nowhere")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    with pytest.raises(
        InferenceError,
        match=r"neither a bertjax work directory \(expected checkpoints/.*config\.json",
    ):
        Model.load(tmp_path / "notes")
    with pytest.raises(InferenceError, match="step=3 applies to bertjax work directories"):
        Model.load(wordpiece_hf_dir, step=3)
    # Weights without a tokenizer.
    bare = tmp_path / "bare"
    shutil.copytree(wordpiece_hf_dir, bare)
    for name in ("vocab.txt", "tokenizer_config.json"):
        (bare / name).unlink()
    with pytest.raises(InferenceError, match="has a model but no tokenizer"):
        Model.load(bare)


def test_checkpoint_and_tokenizer_that_do_not_belong_together(workdir, wordpiece_hf_dir, tmp_path):
    # A work directory whose tokenizer.model was swapped for another one.
    swapped = tmp_path / "swapped"
    shutil.copytree(workdir, swapped)
    other = train_tokenizer(
        training_sentences(500)[:500], TokenizerSettings(vocab_size=400), tmp_path / "other.model"
    )
    other.save(swapped / "tokenizer.model")
    with pytest.raises(InferenceError, match="its vocabulary does not match the checkpoint's"):
        Model.load(swapped)
    # A Hugging Face directory whose vocab.txt has more pieces than the model has rows.
    grown = tmp_path / "grown"
    shutil.copytree(wordpiece_hf_dir, grown)
    with open(grown / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("".join(f"extra{i}\n" for i in range(10)))
    with pytest.raises(InferenceError, match="they do not belong together"):
        Model.load(grown)


def test_checkpoint_without_mlm_head(wordpiece_hf_dir, tmp_path):
    base = transformers.BertModel.from_pretrained(wordpiece_hf_dir)
    base.save_pretrained(tmp_path)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(wordpiece_hf_dir / name, tmp_path / name)
    model = Model.load(tmp_path)
    with pytest.raises(InferenceError, match="has no masked-LM head"):
        model.fill_mask("a [MASK]")
    assert model.embed("still embeds").shape == (1, 32)


# ---------------------------------------------------------------------------------------------
# What the trainer prints at the end of a run
