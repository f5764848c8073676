"""Directories as the hub ships them open with the answers transformers gives.

Each directory is written by transformers itself (save_pretrained, or torch.save for a bare
pytorch_model.bin) from random tiny weights: a tokenizer.json with padding and truncation
sections, added tokens beyond a WordPiece vocabulary, a vocab.txt with tokenizer_config.json's
do_lower_case and model_max_length, weights only as pytorch_model.bin, in bfloat16 or float16,
or sharded with model.safetensors.index.json. bertjax opens each with `Model.load` and as
fine-tuning's `init_from` (its tokenizer and reader).
"""

import json
import warnings

import jax
import numpy as np
import pytest

from bertjax import Model
from bertjax.engine import rundir
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.storage import hf
from configs import finetune as finetune_recipe
from tests.helpers.tokenizer_kinds import (
    pipeline_json,
    text_of,
    with_call_settings,
    wordpiece_vocab,
)
from tests.helpers.torch_params import randomize_torch

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ALONE_ATOL = 1e-5
TRANSFORMERS_ATOL = 1e-4
# Six texts of about 5 to 300 tokens.
SIX = [text_of(n, seed) for seed, n in enumerate((4, 296, 20, 60, 5, 120))]
SPECIALS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
    "unk_token": "[UNK]",
}


def _modernbert_classifier(tokenizer_text, seed=0):
    pipeline_ids = json.loads(tokenizer_text)["added_tokens"]
    ids = {t["content"]: t["id"] for t in pipeline_ids}
    config = transformers.ModernBertConfig(
        vocab_size=-(-(max(ids.values()) + 1) // 8) * 8,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=512,
        local_attention=8,
        global_attn_every_n_layers=2,
        pad_token_id=ids["[PAD]"],
        cls_token_id=ids["[CLS]"],
        sep_token_id=ids["[SEP]"],
        bos_token_id=ids["[CLS]"],
        eos_token_id=ids["[SEP]"],
        num_labels=3,
        attn_implementation="eager",
    )
    return randomize_torch(transformers.ModernBertForSequenceClassification(config), seed)


def _bert_classifier(vocab_size, seed=0):
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=3,
    )
    return randomize_torch(transformers.BertForSequenceClassification(config), seed)


def _write_tokenizer_json(directory, text):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(text)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIALS}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def _transformers_predictions(directory, texts):
    """(label, probability of it) per text, each text alone, as transformers computes them."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        directory, dtype=torch.float32
    ).eval()
    out = []
    for text in texts:
        inputs = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            probs = torch.softmax(model(**inputs).logits[0].float(), -1).numpy()
        label = int(probs.argmax())
        out.append((model.config.id2label[label], float(probs[label])))
    return out


def _assert_predictions(ours, theirs, atol):
    assert [p["label"] for p in ours] == [label for label, _ in theirs]
    np.testing.assert_allclose(
        [p["score"] for p in ours], [score for _, score in theirs], atol=atol, rtol=0
    )


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory):
    """A ModernBertForSequenceClassification directory saved by transformers, its
    tokenizer.json with padding (to the batch's longest) and truncation sections."""
    directory = tmp_path_factory.mktemp("hub") / "modernbert-classifier"
    text = pipeline_json()
    _modernbert_classifier(text).save_pretrained(directory)
    pad_id = json.loads(text)["model"]["vocab"].get("[PAD]")
    pad_id = pad_id if pad_id is not None else _added_id(text, "[PAD]")
    _write_tokenizer_json(directory, with_call_settings(text, pad_id))
    return directory


def _added_id(tokenizer_text, content):
    return next(
        t["id"] for t in json.loads(tokenizer_text)["added_tokens"] if t["content"] == content
    )


def test_a_modernbert_classifier_predicts_each_text_alone_and_together_as_transformers(
    modernbert_dir,
):
    spec = json.loads((modernbert_dir / "tokenizer.json").read_text())
    assert spec["padding"] and spec["truncation"]  # as shipped
    theirs = _transformers_predictions(modernbert_dir, SIX)
    lengths = [
        len(transformers.AutoTokenizer.from_pretrained(modernbert_dir)(t).input_ids) for t in SIX
    ]
    assert 5 <= min(lengths) <= 8 and 280 <= max(lengths) <= 310, lengths
    model = Model.load(modernbert_dir)
    together = model.predict(SIX)
    alone = [model.predict([text])[0] for text in SIX]
    _assert_predictions(together, [(p["label"], p["score"]) for p in alone], ALONE_ATOL)
    _assert_predictions(alone, theirs, TRANSFORMERS_ATOL)
    for batch_size in (1, 4):
        again = Model.load(modernbert_dir, batch_size=batch_size).predict(SIX)
        _assert_predictions(again, theirs, TRANSFORMERS_ATOL)


def test_fine_tuning_from_it_reads_the_ids_transformers_tokenizer_gives(modernbert_dir, tmp_path):
    max_seq_length = 128
    train = tmp_path / "train.csv"
    rows = [f'"{text}",{"yes" if i % 2 else "no"}' for i, text in enumerate(SIX)]
    train.write_text("sentence,label\n" + "\n".join(rows) + "\n")
    config = finetune_recipe.get_config()
    config.task = "classification"
    config.init_from = str(modernbert_dir)
    config.data.train = config.data.validation = str(train)
    config.data.max_seq_length = max_seq_length
    config.batch_size = config.eval_batch_size = 8
    settings = FinetuneSettings.from_config(config)
    # The tokenizer an init_from run takes, read as fine-tuning reads it.
    tokenizer = rundir.open_run(modernbert_dir, pretraining_heads=False).tokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        examples = task_lib.get("classification").read(settings.data, tokenizer).train
    theirs = transformers.AutoTokenizer.from_pretrained(modernbert_dir)(
        SIX, truncation=True, max_length=max_seq_length
    ).input_ids
    for row, ids in enumerate(theirs):
        expected = ids + [0] * (max_seq_length - len(ids))
        assert examples.features["input_ids"][row].tolist() == expected, row
        assert int(examples.features["input_mask"][row].sum()) == len(ids)


# ------------------------------------------------------------------------ weight files


def _save_weights(model, directory, layout):
    """transformers' files for `layout`: safetensors in bfloat16 or float16 (config.json's
    dtype says so), sharded with an index, or a bare pytorch_model.bin."""
    if layout in ("bfloat16", "float16"):
        model.to(getattr(torch, layout)).save_pretrained(directory)
        model.float()
        assert json.loads((directory / "config.json").read_text())["dtype"] == layout
    elif layout == "sharded":
        model.save_pretrained(directory, max_shard_size="20KB")
        assert (directory / hf.SAFE_WEIGHTS_INDEX_NAME).is_file()
        assert not (directory / hf.SAFE_WEIGHTS_NAME).exists()
    else:
        # What save_pretrained writes in config.json, without its safetensors.
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(directory)
        torch.save(model.state_dict(), directory / hf.TORCH_WEIGHTS_NAME)


@pytest.mark.parametrize("layout", ["pytorch_model.bin", "bfloat16", "float16", "sharded"])
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_weight_files_as_shipped_open_with_transformers_answers(family, layout, tmp_path):
    directory = tmp_path / f"{family}-{layout}"
    if family == "bert":
        vocab = wordpiece_vocab()
        model = _bert_classifier(len(vocab))
        directory.mkdir()
        (directory / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
        (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    else:
        text = pipeline_json()
        model = _modernbert_classifier(text)
        _write_tokenizer_json(
            directory, with_call_settings(text, _added_id(text, "[PAD]"), fixed=64)
        )
    _save_weights(model, directory, layout)
    theirs = _transformers_predictions(directory, SIX)
    ours = Model.load(directory, dtype="float32")
    _assert_predictions(ours.predict(SIX), theirs, TRANSFORMERS_ATOL)
    # As fine-tuning's init_from opens it: the same head, tokenizer and parameters.
    run = rundir.open_run(directory, pretraining_heads=False)
    _, params = rundir.read_params(run)
    assert run.head == ours.head and run.tokenizer.fingerprint == ours.tokenizer.fingerprint
    flat_ours = jax.tree_util.tree_leaves_with_path(ours.params)
    flat_run = dict(jax.tree_util.tree_leaves_with_path(params))
    assert len(flat_ours) == len(flat_run)
    for path, leaf in flat_ours:
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(flat_run[path]))


def test_a_shard_the_index_names_but_the_directory_lacks_is_refused_in_one_line(tmp_path):
    directory = tmp_path / "sharded"
    vocab = wordpiece_vocab()
    _save_weights(_bert_classifier(len(vocab)), directory, "sharded")
    (directory / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
    missing = sorted(directory.glob("model-*.safetensors"))[1]
    missing.unlink()
    with pytest.raises(ValueError) as caught:
        Model.load(directory)
    message = str(caught.value)
    assert str(missing) in message and "missing" in message and "\n" not in message


# ------------------------------------------------------------------------ tokenizer files


def _bert_masked_lm(vocab_size, seed=0):
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return randomize_torch(transformers.BertForMaskedLM(config), seed)


def _transformers_fill_mask(directory, text):
    """(top token id, its probability) at the one [MASK] of text, as transformers gives."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory).eval()
    inputs = tokenizer(text, return_tensors="pt")
    position = int((inputs.input_ids[0] == tokenizer.mask_token_id).nonzero()[0, 0])
    with torch.no_grad():
        probs = torch.softmax(model(**inputs).logits[0, position], -1).numpy()
    return inputs.input_ids[0].tolist(), int(probs.argmax()), float(probs.max())


def _assert_fill_mask_as_transformers(directory, texts):
    model = Model.load(directory)
    for text in texts:
        ids, token, score = _transformers_fill_mask(directory, text)
        assert model.encode([text])["input_ids"][0].tolist() == ids
        (best,) = model.fill_mask(text, top_k=1)
        assert best["token"] == token
        assert abs(best["score"] - score) <= TRANSFORMERS_ATOL


def test_a_cased_vocab_txt_with_its_tokenizer_config_reads_as_transformers(tmp_path):
    directory = tmp_path / "cased"
    vocab = wordpiece_vocab(lowercase=False)
    _bert_masked_lm(len(vocab)).save_pretrained(directory)
    (directory / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
    config = {"do_lower_case": False, "model_max_length": 64, "tokenizer_class": "BertTokenizer"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    assert Model.load(directory).tokenizer.lowercase is False
    _assert_fill_mask_as_transformers(
        directory, ["The Ships came [MASK] far.", "see the [MASK] for Details"]
    )


def test_added_tokens_beyond_the_vocabulary_read_as_transformers(tmp_path):
    directory = tmp_path / "added"
    vocab = wordpiece_vocab()
    (tmp_path / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    tokenizer = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    assert len(tokenizer) == len(vocab)
    added = ["<ship>", "<port>"]
    assert tokenizer.add_tokens(added) == 2
    model = _bert_masked_lm(len(vocab))
    model.resize_token_embeddings(len(tokenizer))
    randomize_torch(model, seed=1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    spec = json.loads((directory / "tokenizer.json").read_text())
    assert {t["content"] for t in spec["added_tokens"]} >= set(added)
    tok = Model.load(directory).tokenizer
    assert tok.vocab_size == len(vocab) + 2
    _assert_fill_mask_as_transformers(
        directory, ["the <ship> came from [MASK] <port>.", "grain [MASK] wine"]
    )
