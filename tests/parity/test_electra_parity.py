"""The ELECTRA family against transformers, random weights, both ways: each Electra* class
saved by transformers opens with Model.load and gives its hidden states or logits (within
1e-5), its notebook method runs; each model of ours written by Model.save_hf opens in that
transformers class with nothing missing or unexpected and the same logits."""

import json

import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.electra import hf as electra_hf
from bertjax.encoders.electra import model as electra_model
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.pretrain.objectives.rtd.model import Discriminator
from bertjax.storage import hf
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.task import head_for
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.qa import model as qa_model
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.batches import padded_batch, second_segment
from tests.helpers.params import random_init_from_key
from tests.helpers.torch_params import randomize_torch

ATOL = 1e-5
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "the a of to and in is it was paris france capital city river museum king old".split()
VOCAB = SPECIALS + WORDS + [f"w{i}" for i in range(64 - len(SPECIALS) - len(WORDS))]
TOKENIZER = WordPieceTokenizer(VOCAB, lowercase=True)
LABELS = ("neg", "neutral", "pos")
TAGS = ("O", "B-LOC", "I-LOC")

# Embeddings 16 wide projected to 32 hidden; 2 layers, 4 heads. Dropout off: the step
# parity below compares training steps.
CONFIG = ElectraConfig(
    vocab_size=len(VOCAB),
    embedding_size=16,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
SEQ = 12
LENGTHS = (SEQ, 8, 5)

# transformers class -> our head (None: a head-less class)
HEADS = {
    "ElectraModel": None,
    "ElectraForPreTraining": None,
    "ElectraForMaskedLM": None,
    "ElectraForSequenceClassification": HeadSpec(label_heads.CLASSIFICATION, LABELS),
    "ElectraForTokenClassification": HeadSpec(label_heads.TOKEN_CLASSIFICATION, TAGS),
    "ElectraForQuestionAnswering": HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS),
}


def _batch(seed=0):
    """(ids, mask, token types): [CLS] words [SEP] rows, a pair with B from position 3."""
    ids, mask = padded_batch(
        LENGTHS,
        SEQ,
        vocab_size=len(VOCAB),
        first_word=len(SPECIALS),
        cls_id=TOKENIZER.cls_id,
        sep_id=TOKENIZER.sep_id,
        seed=seed,
    )
    return ids, mask, second_segment(mask, 3)


def _hf_config(config=CONFIG, **extra):
    return transformers.ElectraConfig(
        **{**electra_hf.config_to_hf(config, "ElectraModel"), **extra},
        attn_implementation="eager",
    )


def _hf_model(cls_name, seed=0, config=CONFIG, **extra):
    """A transformers model with every parameter random (its own init zeroes biases and sets
    norms to one, which would hide a swapped bias or scale), the generator's decoder tied."""
    model = randomize_torch(getattr(transformers, cls_name)(_hf_config(config, **extra)), seed, 0.1)
    if cls_name == "ElectraForMaskedLM":
        model.generator_lm_head.weight = model.electra.embeddings.word_embeddings.weight
    return model


def _randomize(init, seed=0):
    """Random parameters in the tree of `init` (rng -> boxed params), unboxed: no scale is one
    and no bias zero. The init is traced for its shapes, not compiled."""
    return random_init_from_key(init, seed, std=0.1)


def _theirs(model, cls_name, ids, mask, segments) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            token_type_ids=torch.from_numpy(segments).long(),
        )
    if cls_name == "ElectraModel":
        return out.last_hidden_state.numpy()
    if cls_name == "ElectraForQuestionAnswering":
        return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], axis=-1)
    return out.logits.numpy()


def _ours(config, params, cls_name, ids, mask, segments) -> np.ndarray:
    head = HEADS[cls_name]
    pretraining = electra_model.ElectraPreTraining(config)
    if cls_name == "ElectraModel":
        out = electra_model.ElectraEncoder(config).apply(
            {"params": params["bert"]}, ids, segments, mask
        )[0]
    elif cls_name == "ElectraForPreTraining":
        # Replaced-token detection's discriminator: the family's encoder and its
        # replaced-token head.
        out = Discriminator(config).apply(
            {"params": params}, ids, segments, mask, method=Discriminator.replaced_logits
        )
    elif cls_name == "ElectraForMaskedLM":
        out = pretraining.apply({"params": params}, ids, segments, mask).mlm_logits
    elif head.task == qa_model.TASK:
        start, end = qa_model.QuestionAnswering(config).apply(
            {"params": params}, ids, segments, mask
        )
        out = np.stack([start, end], axis=-1)  # [b, s, 2]
    else:
        model = label_heads.make_model(config, head.task, head.num_outputs)
        out = model.apply({"params": params}, ids, segments, mask)
    return np.asarray(out)


def _compare(ours, theirs, mask, what):
    if ours.shape[:2] == mask.shape:  # per token: padded positions are not compared
        ours, theirs = ours[mask == 1], theirs[mask == 1]
    assert ours.shape == theirs.shape, what
    diff = float(np.max(np.abs(ours.astype(np.float64) - theirs)))
    print(f"{what}: max |ours - transformers| = {diff:.2e}, max |value| {np.abs(theirs).max():.2f}")
    assert diff < ATOL, what


def _extra(cls_name):
    head = HEADS[cls_name]
    if head is None or head.task == qa_model.TASK:
        return {}
    return {"id2label": dict(enumerate(head.labels))}


@pytest.mark.parametrize("cls_name", list(HEADS))
def test_a_transformers_directory_opens_with_equal_outputs(cls_name, tmp_path):
    theirs = _hf_model(cls_name, seed=1, **_extra(cls_name))
    theirs.save_pretrained(tmp_path)
    TOKENIZER.save_hf(tmp_path)
    model = bertjax.Model.load(tmp_path)
    assert encoders.family_of(model.config).name == "electra"
    assert model.config.embedding_size == 16 and model.config.hidden_size == 32
    assert model.head == HEADS[cls_name]
    fresh = set(model.fresh_heads)
    trained = {
        "ElectraForPreTraining": "discriminator_head",
        "ElectraForMaskedLM": "mlm_head",
        "ElectraForSequenceClassification": "pooler",
    }
    assert trained.get(cls_name, "-") not in fresh
    ids, mask, segments = _batch()
    ours = _ours(model.config, model.params, cls_name, ids, mask, segments)
    _compare(ours, _theirs(theirs, cls_name, ids, mask, segments), mask, cls_name)

    # The notebook method of the directory runs, as transformers would answer.
    if cls_name == "ElectraForSequenceClassification":
        text = "the old king of france"
        got = model.predict(text)
        row = np.asarray([model.encode([text])["input_ids"][0]], np.int32)
        logits = _theirs(theirs, cls_name, row, np.ones_like(row), np.zeros_like(row))
        probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
        assert got["label"] == LABELS[int(np.argmax(probs))]
        assert abs(got["score"] - float(np.max(probs))) < ATOL
    elif cls_name == "ElectraForTokenClassification":
        got = model.predict("the king of france")
        assert [w["word"] for w in got] == ["the", "king", "of", "france"]
        assert all(w["label"] in TAGS for w in got)
    elif cls_name == "ElectraForQuestionAnswering":
        got = model.answer("who was the king", "the old king of france built the museum")
        assert set(got) == {"score", "start", "end", "answer"}
    elif cls_name == "ElectraModel":
        with pytest.raises(bertjax.inference.InferenceError, match="no masked-LM head"):
            model.fill_mask("the [MASK] .")
        text = "the museum in paris"
        row = np.asarray([model.encode([text])["input_ids"][0]], np.int32)
        hidden = _theirs(theirs, cls_name, row, np.ones_like(row), np.zeros_like(row))
        vector = model.embed([text])[0]
        assert float(np.max(np.abs(vector - hidden[0].mean(0)))) < ATOL


def test_fill_mask_on_a_generator_directory_is_transformers_top_k(tmp_path):
    theirs = _hf_model("ElectraForMaskedLM", seed=2)
    theirs.save_pretrained(tmp_path)
    TOKENIZER.save_hf(tmp_path)
    model = bertjax.Model.load(tmp_path)
    text = "the capital of france is [MASK] ."
    filled = model.fill_mask(text, top_k=3)
    example = model.encode([text])["input_ids"][0]
    at = int(np.flatnonzero(example == TOKENIZER.mask_id)[0])
    with torch.no_grad():
        logits = theirs(input_ids=torch.from_numpy(np.asarray([example])).long()).logits
    probs = logits[0, at].softmax(-1).numpy()
    top = np.argsort(-probs)[:3]
    assert [f["token"] for f in filled] == top.tolist()
    assert float(np.max(np.abs(np.array([f["score"] for f in filled]) - probs[top]))) < ATOL


@pytest.mark.parametrize("cls_name", list(HEADS))
def test_our_model_saved_opens_in_transformers_with_equal_outputs(cls_name, tmp_path):
    head = HEADS[cls_name]
    family = encoders.family_of(CONFIG)
    if head is None:
        params = _randomize(family.pretraining_init(CONFIG), seed=3)
    else:
        params = _randomize(capability.of(head).init(CONFIG, head), seed=3)
    # The head-less classes: which pretraining head the model has trained picks the class.
    untrained = {
        "ElectraModel": ("mlm_head", "discriminator_head", "pooler"),
        "ElectraForPreTraining": ("mlm_head", "pooler"),
        "ElectraForMaskedLM": ("discriminator_head", "pooler"),
    }.get(cls_name, ())
    bertjax.Model(CONFIG, params, TOKENIZER, head=head, fresh_heads=untrained).save_hf(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [cls_name] and written["model_type"] == "electra"
    names = set(hf.read_weights(tmp_path)[0])
    assert "generator_lm_head.weight" not in names  # tied: transformers leaves it out too
    theirs, info = getattr(transformers, cls_name).from_pretrained(
        tmp_path, attn_implementation="eager", output_loading_info=True
    )
    assert not any(info.values()), info
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)("the king").input_ids == [
        TOKENIZER.cls_id,
        *TOKENIZER.encode("the king"),
        TOKENIZER.sep_id,
    ]
    ids, mask, segments = _batch(seed=4)
    ours = _ours(CONFIG, params, cls_name, ids, mask, segments)
    _compare(ours, _theirs(theirs.eval(), cls_name, ids, mask, segments), mask, cls_name)


def test_embedding_width_equal_to_hidden_has_no_projection_both_ways(tmp_path):
    config = ElectraConfig(**{**CONFIG.to_dict(), "embedding_size": CONFIG.hidden_size})
    theirs = _hf_model("ElectraForPreTraining", seed=5, config=config)
    assert not hasattr(theirs.electra, "embeddings_project")
    theirs.save_pretrained(tmp_path / "theirs")
    TOKENIZER.save_hf(tmp_path / "theirs")
    model = bertjax.Model.load(tmp_path / "theirs")
    assert "embeddings_project" not in model.params["bert"]
    ids, mask, segments = _batch(seed=5)
    ours = _ours(model.config, model.params, "ElectraForPreTraining", ids, mask, segments)
    expected = _theirs(theirs, "ElectraForPreTraining", ids, mask, segments)
    _compare(ours, expected, mask, "no projection, read")
    model.save_hf(tmp_path / "ours")
    again = transformers.ElectraForPreTraining.from_pretrained(
        tmp_path / "ours", attn_implementation="eager"
    ).eval()
    _compare(ours, _theirs(again, "ElectraForPreTraining", ids, mask, segments), mask, "written")


def test_an_embedding_model_on_electra_exports_as_sentence_transformers_electra(tmp_path):
    head = head_for(EmbeddingSpec(pooling="mean", normalize=True, max_seq_length=SEQ))
    params = _randomize(capability.of(head).init(CONFIG, head), seed=6)
    model = bertjax.Model(CONFIG, params, TOKENIZER, head=head)
    texts = ["the king of france", "a river in paris"]
    vectors = model.embed(texts)
    model.save_hf(tmp_path)
    transformer = json.loads((tmp_path / "config.json").read_text())
    assert transformer["architectures"] == ["ElectraModel"]
    again = bertjax.Model.load(tmp_path)
    assert encoders.family_of(again.config).name == "electra"
    np.testing.assert_allclose(again.embed(texts), vectors, atol=ATOL)
    reference = transformers.ElectraModel.from_pretrained(tmp_path, attn_implementation="eager")
    for text, vector in zip(texts, vectors):
        ids = np.asarray([model.encode([text])["input_ids"][0]], np.int32)
        with torch.no_grad():
            hidden = reference.eval()(input_ids=torch.from_numpy(ids).long()).last_hidden_state
        mean = hidden[0].mean(0).numpy()
        assert float(np.max(np.abs(vector - mean / np.linalg.norm(mean)))) < ATOL
