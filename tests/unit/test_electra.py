"""The ELECTRA family without torch: its config and registry entry, the encoder's modes
(packed tokens, [CLS] only, scanned layers, a mesh) against its plain call, and its
transformers tensor map written and read back. The parity with transformers itself is in
tests/parity/test_electra_parity.py."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.electra import hf as electra_hf
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.storage import hf
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.seq2seq.options import TaskOptions
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.batches import padded_batch, second_segment
from tests.helpers.params import random_init_from_key

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
TOKENIZER = WordPieceTokenizer(VOCAB, lowercase=True)
CONFIG = ElectraConfig(
    vocab_size=len(VOCAB),
    embedding_size=8,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=24,
    max_position_embeddings=16,
)
LABELS = ("a", "b", "c")


def _batch(seed=0):
    """(ids, mask, token types): rows of 10, 7, 4 and 10 tokens, the second segment from 5."""
    ids, mask = padded_batch(
        [10, 7, 4, 10], 10, vocab_size=len(VOCAB), first_word=5, cls_id=TOKENIZER.cls_id, seed=seed
    )
    return ids, mask, second_segment(mask, 5)


def test_the_family_is_registered_and_its_config_travels_in_meta():
    family = encoders.family_of(CONFIG)
    assert family.name == "electra" and encoders.for_model_type("electra") is family
    d = encoders.config_to_dict(CONFIG)
    assert d[encoders.FAMILY_KEY] == "electra"
    assert encoders.config_from_dict(json.loads(json.dumps(d))) == CONFIG
    with pytest.raises(ValueError, match="unknown ElectraConfig fields"):
        encoders.config_from_dict({"family": "electra", "local_attention": 8})
    with pytest.raises(ValueError, match="ElectraConfig.hidden_size=15 is invalid"):
        dataclasses.replace(CONFIG, hidden_size=15)
    with pytest.raises(ValueError, match="ElectraConfig.embedding_size=0 is invalid"):
        dataclasses.replace(CONFIG, embedding_size=0)
    assert CONFIG.classifier_rate == CONFIG.hidden_dropout
    assert dataclasses.replace(CONFIG, classifier_dropout=0.3).classifier_rate == 0.3


def test_presets_read_and_seq2seq_refuses_electra_in_one_line():
    small = encoders.get("electra").from_settings("small", {"hidden_dropout": 0.0})
    assert (small.embedding_size, small.hidden_size, small.num_layers) == (128, 256, 12)
    assert (small.num_heads, small.intermediate_size, small.hidden_dropout) == (4, 1024, 0.0)
    with pytest.raises(ValueError, match="ELECTRA preset 'huge' is unknown"):
        encoders.get("electra").from_settings("huge", {})
    options = TaskOptions(decoder_start_id=TOKENIZER.cls_id, eos_id=TOKENIZER.sep_id)
    with pytest.raises(ValueError, match="seq2seq needs a BERT encoder; ElectraConfig"):
        options.config(CONFIG)


def test_the_tensor_map_writes_and_reads_back_every_class(tmp_path):
    family = encoders.family_of(CONFIG)
    params = random_init_from_key(family.pretraining_init(CONFIG), seed=1, std=0.1)
    # A generator: ElectraForMaskedLM, read back with the discriminator and pooler fresh.
    family.write_transformers(
        CONFIG, params, tmp_path / "gen", untrained=("discriminator_head", "pooler")
    )
    written = json.loads((tmp_path / "gen" / "config.json").read_text())
    assert written["architectures"] == ["ElectraForMaskedLM"]
    assert written["embedding_size"] == 8 and written["num_hidden_layers"] == 2
    config, read, head, fresh = encoders.read_transformers(tmp_path / "gen")
    assert config == CONFIG and head is None and fresh == ("discriminator_head", "pooler")
    ours, back = dict(hf.flatten_tree(params)), dict(hf.flatten_tree(read))
    kept = [p for p in ours if p[0] in ("bert", "mlm_head") and p[1] != "pooler"]
    assert len(kept) == 2 + 5 + 2 * 16 + 5  # projection, embeddings, layers, generator head
    for path in kept:
        np.testing.assert_array_equal(np.asarray(ours[path]), back[path], err_msg=str(path))
    # A sequence classifier: classifier.dense is the encoder's pooler, out_proj the head.
    head = HeadSpec(label_heads.CLASSIFICATION, LABELS)
    tree = random_init_from_key(capability.of(head).init(CONFIG, head), seed=2, std=0.1)
    family.write_transformers(CONFIG, tree, tmp_path / "cls", head=head)
    written = hf.read_weights(tmp_path / "cls")[0]
    assert {"classifier.dense.weight", "classifier.out_proj.weight"} <= set(written)
    _, back, read_head, fresh = encoders.read_transformers(tmp_path / "cls")
    assert read_head == head and fresh == ()
    # Both layers of the head travel under its tensor map's names (EncoderFamily.head).
    layers = family.head(CONFIG, "classifier", len(LABELS), capability.POOLED).tensors
    ours, theirs = dict(hf.flatten_tree(tree)), dict(hf.flatten_tree(back))
    assert len(layers) == 4
    for spec in layers:
        assert written[spec.hf_name].shape == spec.hf_shape
        np.testing.assert_array_equal(theirs[spec.path], np.asarray(ours[spec.path]))


def test_bad_directories_are_refused_naming_the_tensor(tmp_path):
    family = encoders.family_of(CONFIG)
    params = random_init_from_key(family.pretraining_init(CONFIG), seed=3, std=0.1)
    family.write_transformers(CONFIG, params, tmp_path, untrained=("mlm_head", "pooler"))
    weights = tmp_path / hf.SAFE_WEIGHTS_NAME
    tensors = load_file(weights)
    save_file(
        {**tensors, "generator_lm_head.weight": np.ones((len(VOCAB), 8), np.float32)}, weights
    )
    with pytest.raises(ValueError, match="'generator_lm_head.weight' differs"):
        encoders.read_transformers(tmp_path)
    save_file({k: v for k, v in tensors.items() if "dense_prediction.bias" not in k}, weights)
    with pytest.raises(ValueError, match="missing tensor 'discriminator_predictions"):
        encoders.read_transformers(tmp_path)
    save_file({**tensors, "electra.pooler.dense.weight": np.ones((16, 16), np.float32)}, weights)
    with pytest.raises(ValueError, match="unexpected tensor.*'electra.pooler.dense.weight'"):
        encoders.read_transformers(tmp_path)
    with pytest.raises(ValueError, match="override embedding_size=4 is fixed by the checkpoint"):
        electra_hf.config_from_hf({"model_type": "electra"}, embedding_size=4)
    with pytest.raises(ValueError, match="hidden_act='relu' is not supported"):
        electra_hf.config_from_hf({"model_type": "electra", "hidden_act": "relu"})


@settings(max_examples=10, deadline=None)
@given(
    embedding=st.sampled_from([4, 8, 16]),
    heads=st.sampled_from([1, 2, 4]),
    layers=st.integers(1, 3),
    act=st.sampled_from(["gelu", "gelu_tanh"]),
    classifier_dropout=st.sampled_from([None, 0.0, 0.25]),
)
def test_config_json_round_trips(embedding, heads, layers, act, classifier_dropout):
    config = dataclasses.replace(
        CONFIG,
        embedding_size=embedding,
        num_heads=heads,
        num_layers=layers,
        hidden_act=act,
        classifier_dropout=classifier_dropout,
    )
    hf_config = json.loads(json.dumps(electra_hf.config_to_hf(config, "ElectraModel")))
    assert electra_hf.config_from_hf(hf_config) == config
    # What transformers leaves out of config.json is its ElectraConfig default.
    assert electra_hf.config_from_hf({"model_type": "electra"}).embedding_size == 128
