"""The parity tests of test_encoders.py (tests/unit/), with its helpers."""

import json

import numpy as np
import pytest

import bertjax
from bertjax import encoders
from bertjax.storage import hf
from bertjax.tasks.qa import model as qa_model
from tests.helpers.encoders import (
    ATOL,
    CASES,
    CONFIG,
    LABELS,
    SEQ,
    TAGS,
    TOKENIZER,
    _batch,
    _hf_model,
    _our_logits,
    _run_torch,
    _torch,
    _torch_logits,
    hub_dir,  # noqa: F401 (fixtures)
)
from tests.helpers.params import max_diff, random_init_from_key


@pytest.mark.parametrize("case", list(CASES))
def test_our_head_saved_loads_in_transformers_with_equal_logits(case, tmp_path):
    _, transformers = _torch()
    head, cls_suffix, pooling = CASES[case]
    config = encoders.config_from_dict(
        {**encoders.config_to_dict(CONFIG), "classifier_pooling": pooling}
    )
    params = random_init_from_key(bertjax.capability.of(head).init(config, head), 1, std=0.1)
    model = bertjax.Model(config, params, TOKENIZER, head=head)
    model.save_hf(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [f"ModernBertFor{cls_suffix}"]
    assert written["model_type"] == "modernbert"
    theirs = getattr(transformers, f"ModernBertFor{cls_suffix}").from_pretrained(
        tmp_path, attn_implementation="eager"
    )
    theirs.eval()
    ids, mask = _batch()
    ours = _our_logits(config, head, model.params, ids, mask)
    expected = _torch_logits(theirs, head, ids, mask)
    if head.token_level or head.task == qa_model.TASK:  # padded positions are not compared
        ours, expected = ours[mask == 1], expected[mask == 1]
    assert ours.shape == expected.shape
    diff = max_diff(ours, expected)
    print(
        f"{case}: max |ours - transformers| = {diff:.2e}, max |logit| {np.abs(expected).max():.2f}"
    )
    assert diff < ATOL


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_head_loads_with_equal_logits(case, tmp_path):
    head, cls_suffix, pooling = CASES[case]
    extra = {"classifier_pooling": pooling}
    if head.task != qa_model.TASK:
        extra["id2label"] = dict(enumerate(head.labels))
    theirs = _hf_model(f"ModernBertFor{cls_suffix}", CONFIG, seed=2, **extra)
    theirs.save_pretrained(tmp_path)
    TOKENIZER.save_hf(tmp_path)
    model = bertjax.Model.load(tmp_path)
    assert model.head == head
    assert model.config.classifier_pooling == pooling
    ids, mask = _batch()
    ours = _our_logits(model.config, head, model.params, ids, mask)
    expected = _torch_logits(theirs, head, ids, mask)
    if head.token_level or head.task == qa_model.TASK:
        ours, expected = ours[mask == 1], expected[mask == 1]
    diff = max_diff(ours, expected)
    print(
        f"{case}: max |ours - transformers| = {diff:.2e}, max |logit| {np.abs(expected).max():.2f}"
    )
    assert diff < ATOL
    # The notebook method of the head runs on the directory.
    if head.task == "classification":
        text = "the louvre is a famous museum in paris"
        got = model.predict(text)
        ids1 = np.asarray([model.encode([text])["input_ids"][0]], np.int32)
        probs = _run_torch(theirs, ids1, np.ones_like(ids1)).logits.softmax(-1)[0].numpy()
        assert got["label"] == LABELS[int(np.argmax(probs))]
        assert abs(got["score"] - float(np.max(probs))) < ATOL
    elif head.token_level:
        got = model.predict("the king of france")
        assert [w["word"] for w in got] == ["the", "king", "of", "france"]
        assert all(w["label"] in TAGS for w in got)
    else:
        got = model.answer("who was the king", "the old king of france built the louvre")
        assert set(got) == {"score", "start", "end", "answer"}


def test_masked_lm_both_ways_and_fill_mask(tmp_path):
    torch, transformers = _torch()
    family = encoders.family_of(CONFIG)
    theirs = _hf_model("ModernBertForMaskedLM", CONFIG, seed=3)
    with torch.no_grad():  # the decoder is tied: the noise above drew it apart
        theirs.decoder.weight = theirs.model.embeddings.tok_embeddings.weight
    theirs.save_pretrained(tmp_path / "theirs")
    TOKENIZER.save_hf(tmp_path / "theirs")
    model = bertjax.Model.load(tmp_path / "theirs")
    assert model.head is None and model.fresh_heads == ()
    ids, mask = _batch()
    positions = np.tile(np.arange(SEQ, dtype=np.int32), (3, 1))
    ours = (
        family.pretraining_model(model.config)
        .apply({"params": model.params}, ids, None, mask, positions)
        .mlm_logits
    )
    expected = _run_torch(theirs, ids, mask).logits.numpy()
    assert max_diff(ours[mask == 1], expected[mask == 1]) < ATOL

    text = "the capital of france is [MASK] ."
    filled = model.fill_mask(text, top_k=3)
    example = model.encode([text])["input_ids"][0]
    at = int(np.flatnonzero(example == TOKENIZER.mask_id)[0])
    row = torch.from_numpy(np.asarray([example])).long()
    with torch.no_grad():
        probs = theirs(input_ids=row).logits[0, at].softmax(-1).numpy()
    top = np.argsort(-probs)[:3]
    assert [f["token"] for f in filled] == top.tolist()
    assert max_diff([f["score"] for f in filled], probs[top]) < ATOL

    # Ours -> save_hf -> transformers: the tied decoder is left out, as transformers writes it.
    params = random_init_from_key(family.pretraining_init(CONFIG), 4, std=0.1)
    bertjax.Model(CONFIG, params, TOKENIZER).save_hf(tmp_path / "ours")
    names = set(hf.read_weights(tmp_path / "ours")[0])
    assert "decoder.weight" not in names and "decoder.bias" in names
    reloaded = transformers.ModernBertForMaskedLM.from_pretrained(
        tmp_path / "ours", attn_implementation="eager"
    ).eval()
    ours = (
        family.pretraining_model(CONFIG)
        .apply({"params": params}, ids, None, mask, positions)
        .mlm_logits
    )
    expected = _run_torch(reloaded, ids, mask).logits.numpy()
    assert max_diff(ours[mask == 1], expected[mask == 1]) < ATOL


def test_embed_on_a_modernbert_model_directory_is_the_mean_hidden_state(tmp_path):
    torch, _ = _torch()
    theirs = _hf_model("ModernBertModel", CONFIG, seed=5)
    theirs.save_pretrained(tmp_path)
    TOKENIZER.save_hf(tmp_path)
    model = bertjax.Model.load(tmp_path)
    # A bare encoder: no prediction head to fill masks or pool with.
    assert {"mlm_head", "pooler"} <= set(model.fresh_heads)
    with pytest.raises(bertjax.inference.InferenceError, match="no masked-LM head"):
        model.fill_mask("the [MASK] .")
    texts = ["the louvre is in paris", "a river"]
    vectors = model.embed(texts)
    for text, vector in zip(texts, vectors):
        ids = np.asarray([model.encode([text])["input_ids"][0]], np.int32)
        with torch.no_grad():
            hidden = theirs(input_ids=torch.from_numpy(ids).long()).last_hidden_state
        assert max_diff(vector, hidden[0].mean(0).numpy()) < ATOL
    # ...and written back as a ModernBertModel, without the untrained head.
    model.save_hf(tmp_path / "again")
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert written["architectures"] == ["ModernBertModel"]
    again = bertjax.Model.load(tmp_path / "again")
    np.testing.assert_array_equal(again.embed(texts), vectors)


def test_a_hub_modernbert_directory_with_a_byte_level_bpe_tokenizer_opens(hub_dir, tmp_path):
    torch, transformers = _torch()
    directory, theirs = hub_dir
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = bertjax.Model.load(directory)
    tokenizer = model.tokenizer
    assert tokenizer.kind == "pipeline"
    assert (tokenizer.cls_id, tokenizer.mask_id) == (
        hf_tokenizer.cls_token_id,
        hf_tokenizer.mask_token_id,
    )
    texts = ["The capital of France is Paris.", "Who built it? The king, in 1607!", ""]
    for text in texts:
        assert tokenizer.encode(text) == hf_tokenizer(text, add_special_tokens=False).input_ids
    encoded = model.encode(texts[:2], text_pairs=["the river", "old"])
    want = hf_tokenizer(texts[:2], ["the river", "old"]).input_ids  # [CLS] A [SEP] B [SEP]
    ours = [
        list(row[mask == 1])
        for row, mask in zip(np.asarray(encoded["input_ids"]), np.asarray(encoded["input_mask"]))
    ]
    assert ours == want
    # Words one by one (token labels) as they read inside a text, each after a space: what
    # add_prefix_space=True means for a byte-level pipeline.
    words = ["The", "king", "built", "Paris"]
    want = hf_tokenizer(" The king built Paris", add_special_tokens=False).input_ids
    assert [i for word in tokenizer.encode_words(words) for i in word] == want
    assert tokenizer.decode(tokenizer.encode(texts[1])) == texts[1]

    text = "The capital of France is [MASK]."
    filled = model.fill_mask(text, top_k=3)
    inputs = hf_tokenizer([text], return_tensors="pt")
    at = int((inputs["input_ids"][0] == hf_tokenizer.mask_token_id).nonzero()[0])
    with torch.no_grad():
        probs = theirs(**inputs).logits[0, at].softmax(-1).numpy()
    top = np.argsort(-probs)[:3]
    assert [f["token"] for f in filled] == top.tolist()
    assert max_diff([f["score"] for f in filled], probs[top]) < ATOL

    # Exported and read back: the same tokenizer (fingerprint), transformers reads it too.
    model.save_hf(tmp_path / "export")
    again = bertjax.Model.load(tmp_path / "export")
    assert again.tokenizer.fingerprint == tokenizer.fingerprint
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    assert exported(texts[0]).input_ids == hf_tokenizer(texts[0]).input_ids
