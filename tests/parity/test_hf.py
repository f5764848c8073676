"""Weights and tokenizers in and out of Hugging Face transformers, checked against torch's BERT."""

import copy
import functools
import json
import logging
import sys

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors import numpy as safetensors_numpy

from bertjax.encoders.bert import config as bert_config
from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.finetune import warm_start
from bertjax.storage import hf
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.finetune_hf import CONFIG as SMALL
from tests.helpers.hf import (
    _abstract_params,
    _random_params,
    _read_dir,
    sentencepiece,  # noqa: F401 (fixtures)
)
from tests.helpers.tokenizer import VARIED, write_wordpiece_vocab
from tests.helpers.torch_params import randomize_torch
from tests.helpers.transformers_config import transformers_bert

ATOL = 1e-4


def _hf_config(**changes):
    """finetune_hf's small BERT (every dimension distinct, so a swapped axis shows) in
    transformers' terms."""
    return transformers_bert(
        SMALL, **{"type_vocab_size": 2, "attn_implementation": "eager", **changes}
    )


def _hf_pretraining_model(seed=0, **changes):
    model = transformers.BertForPreTraining(_hf_config(**changes))
    return randomize_torch(model, seed).eval()


def _batch(vocab_size, batch=3, seq=16, seed=0):
    """Padded batch with both segments present in every row."""
    rng = np.random.default_rng(seed)
    lengths = [seq, 11, 6]
    ids = np.zeros((batch, seq), np.int32)
    types = np.zeros((batch, seq), np.int32)
    mask = np.zeros((batch, seq), np.int32)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(5, vocab_size, n)
        types[b, n // 2 : n] = 1
        mask[b, :n] = 1
    return ids, types, mask


def _torch_outputs(model, ids, types, mask):
    args = dict(
        input_ids=torch.from_numpy(ids).long(),
        token_type_ids=torch.from_numpy(types).long(),
        attention_mask=torch.from_numpy(mask).long(),
    )
    with torch.no_grad():
        base = model.bert(**args)
        heads = model(**args)
    return dict(
        sequence_output=base.last_hidden_state.numpy(),
        pooled_output=base.pooler_output.numpy(),
        mlm_logits=heads.prediction_logits.numpy(),
        nsp_logits=heads.seq_relationship_logits.numpy(),
    )


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, ids, types, mask):
    return BertForPreTraining(config).apply(
        {"params": params}, ids, types, mask, deterministic=True
    )


def _bertjax_outputs(config, params, ids, types, mask):
    out = _forward(config, params, ids, types, mask)
    return dict(
        sequence_output=np.asarray(out.sequence_output),
        pooled_output=np.asarray(out.pooled_output),
        mlm_logits=np.asarray(out.mlm_logits),
        nsp_logits=np.asarray(out.nsp_logits),
    )


def _assert_outputs_close(ours, theirs, mask):
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key].shape == theirs[key].shape, key
        np.testing.assert_allclose(ours[key], theirs[key], atol=ATOL, rtol=0, err_msg=key)
    # The comparison must be about real numbers, not two sets of zeros.
    assert np.abs(theirs["mlm_logits"][mask.astype(bool)]).mean() > 0.1


def _shapes(tree):
    return jax.tree.map(lambda x: tuple(np.shape(x)), tree)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random transformers BertForPreTraining saved with save_pretrained."""
    path = tmp_path_factory.mktemp("hf_pretraining")
    model = _hf_pretraining_model(seed=1)
    model.save_pretrained(path)
    return path, model


@pytest.mark.parametrize("hidden_act,scan_layers", [("gelu", False), ("gelu_pytorch_tanh", True)])
def test_hf_to_bertjax_matches_torch(tmp_path, hidden_act, scan_layers):
    model = _hf_pretraining_model(seed=2, hidden_act=hidden_act)
    model.save_pretrained(tmp_path)
    config, params = bert_hf.load(tmp_path, scan_layers=scan_layers, attention_impl="xla")
    assert config.hidden_act == {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}[hidden_act]
    assert (
        config.vocab_size,
        config.hidden_size,
        config.num_layers,
        config.num_heads,
        config.intermediate_size,
        config.max_position_embeddings,
    ) == (99, 32, 2, 4, 48, 40)
    assert config.scan_layers == scan_layers
    assert ("layers" in params["bert"]["encoder"]) == scan_layers
    assert _shapes(params) == _shapes(_abstract_params(config))
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in jax.tree.leaves(params))

    ids, types, mask = _batch(config.vocab_size)
    _assert_outputs_close(
        _bertjax_outputs(config, params, ids, types, mask),
        _torch_outputs(model, ids, types, mask),
        mask,
    )


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_bertjax_to_hf_matches_torch(tmp_path, positions):
    # Sinusoidal positions travel as HF's absolute embeddings holding the fixed table.
    config = BertConfig.preset(
        "tiny",
        vocab_size=97,
        max_position_embeddings=24,
        attention_impl="xla",
        position_embedding_type=positions,
    )
    params = _random_params(config, seed=3)
    bert_hf.save(config, params, tmp_path)

    model, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert {k: list(v) for k, v in info.items()} == {
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "error_msgs": [],
    }
    model.eval()
    assert model.config.hidden_act == "gelu"
    assert model.config.hidden_size == config.hidden_size
    assert model.config.num_hidden_layers == config.num_layers
    # Tied as in HF: the decoder is the word embedding matrix itself.
    decoder, words = (
        model.cls.predictions.decoder.weight,
        model.bert.embeddings.word_embeddings.weight,
    )
    assert decoder.data_ptr() == words.data_ptr()

    ids, types, mask = _batch(config.vocab_size, seed=4)
    _assert_outputs_close(
        _bertjax_outputs(config, params, ids, types, mask),
        _torch_outputs(model, ids, types, mask),
        mask,
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_bertjax_hf_round_trip_is_bit_identical(tmp_path, hf_dir, dtype):
    source, model = hf_dir
    if dtype == "bfloat16":
        source = tmp_path / "bf16"
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(source)
    config, params = bert_hf.load(source, param_dtype=dtype)
    assert {np.dtype(x.dtype).name for x in jax.tree.leaves(params)} == {dtype}
    bert_hf.save(config, params, tmp_path / "out")
    before, after = _read_dir(source), _read_dir(tmp_path / "out")
    assert before.keys() == after.keys()
    for name in before:
        assert before[name].dtype == after[name].dtype, name
        np.testing.assert_array_equal(
            before[name].view(np.uint8), after[name].view(np.uint8), err_msg=name
        )
    old_cfg = json.loads((source / hf.CONFIG_NAME).read_text())
    new_cfg = json.loads((tmp_path / "out" / hf.CONFIG_NAME).read_text())
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "dtype",
    ):
        assert old_cfg[key] == new_cfg[key], key


def test_fine_tuning_from_a_bert_model_directory_misses_no_head(tmp_path, caplog):
    """A fine-tuning run takes the encoder only: a BertModel directory's missing MLM and NSP
    heads are neither made up nor warned about."""
    base = randomize_torch(transformers.BertModel(_hf_config()), seed=6).eval()
    base.save_pretrained(tmp_path)
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces += [f"w{i}" for i in range(SMALL.vocab_size - len(pieces))]
    (tmp_path / "vocab.txt").write_text("".join(p + "\n" for p in pieces))
    with caplog.at_level(logging.WARNING, logger="bertjax.storage.hf"):
        source = warm_start.open_source(tmp_path)
    assert "freshly initialised" not in caplog.text
    assert set(source.params) == {"bert"} and source.fresh == ()


def test_bert_model_checkpoint_loads_with_fresh_heads(tmp_path, caplog):
    base = randomize_torch(transformers.BertModel(_hf_config()), seed=6).eval()
    base.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertjax.storage.hf"):
        config, params, report = bert_hf.load_with_report(tmp_path, seed=7, attention_impl="xla")
    heads = [
        "mlm_head/output_bias",
        "mlm_head/transform/kernel",
        "mlm_head/transform/bias",
        "mlm_head/layer_norm/scale",
        "mlm_head/layer_norm/bias",
        "nsp_head/kernel",
        "nsp_head/bias",
    ]
    assert sorted(report.initialized) == sorted(heads)
    assert "mlm_head/transform/kernel" in caplog.text and "nsp_head/kernel" in caplog.text
    assert params["mlm_head"]["transform"]["kernel"].shape == (32, 32)
    assert params["nsp_head"]["kernel"].shape == (32, 2)
    # Fresh kernels follow the model's init (random, std ~ initializer_range), not zeros.
    assert 0.01 < params["mlm_head"]["transform"]["kernel"].std() < 0.03
    # The encoder is the checkpoint's: sequence and pooled outputs match transformers.BertModel.
    ids, types, mask = _batch(config.vocab_size, seed=8)
    ours = _bertjax_outputs(config, params, ids, types, mask)
    with torch.no_grad():
        theirs = base(
            input_ids=torch.from_numpy(ids).long(),
            token_type_ids=torch.from_numpy(types).long(),
            attention_mask=torch.from_numpy(mask).long(),
        )
    np.testing.assert_allclose(
        ours["sequence_output"], theirs.last_hidden_state.numpy(), atol=ATOL, rtol=0
    )
    np.testing.assert_allclose(
        ours["pooled_output"], theirs.pooler_output.numpy(), atol=ATOL, rtol=0
    )
    # Seeded: the same seed gives the same heads.
    _, again = bert_hf.load(tmp_path, seed=7)
    np.testing.assert_array_equal(again["nsp_head"]["kernel"], params["nsp_head"]["kernel"])


def test_pytorch_model_bin_loads_like_safetensors(tmp_path, hf_dir):
    source, model = hf_dir
    # The legacy format: a pickled state dict, as older transformers wrote it.
    torch.save(model.state_dict(), tmp_path / hf.TORCH_WEIGHTS_NAME)
    model.config.to_json_file(tmp_path / hf.CONFIG_NAME)
    _, from_bin, report = bert_hf.load_with_report(tmp_path)
    assert report.source.endswith(hf.TORCH_WEIGHTS_NAME)
    _, from_safe = bert_hf.load(source)
    jax.tree.map(np.testing.assert_array_equal, from_bin, from_safe)


def test_sharded_checkpoint_loads_like_single_file(tmp_path, hf_dir):
    source, model = hf_dir
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert not (tmp_path / hf.SAFE_WEIGHTS_NAME).exists()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    _, sharded, report = bert_hf.load_with_report(tmp_path)
    assert report.source.endswith(hf.SAFE_WEIGHTS_INDEX_NAME)
    _, single = bert_hf.load(source)
    jax.tree.map(np.testing.assert_array_equal, sharded, single)


def test_pytorch_model_bin_without_torch_fails_clearly(tmp_path, hf_dir, monkeypatch):
    _, model = hf_dir
    torch.save(model.state_dict(), tmp_path / hf.TORCH_WEIGHTS_NAME)
    model.config.to_json_file(tmp_path / hf.CONFIG_NAME)
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(ImportError, match="pytorch_model.bin needs torch"):
        bert_hf.load(tmp_path)


def test_old_names_and_missing_prefix_load_the_same(tmp_path, hf_dir):
    source, _ = hf_dir
    tensors = _read_dir(source)
    renamed = {}
    for name, array in tensors.items():
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
        if name.startswith("bert."):
            name = name[len("bert.") :]
        renamed[name] = array
    # Extras older exports carry: the position_ids buffer and the tied decoder copies.
    renamed["embeddings.position_ids"] = np.arange(40, dtype=np.int64)[None]
    renamed["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    renamed["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"]
    assert any(n.endswith("LayerNorm.gamma") for n in renamed)
    safetensors_numpy.save_file(renamed, tmp_path / hf.SAFE_WEIGHTS_NAME)
    (tmp_path / hf.CONFIG_NAME).write_text((source / hf.CONFIG_NAME).read_text())
    _, old_style, report = bert_hf.load_with_report(tmp_path)
    _, canonical = bert_hf.load(source)
    jax.tree.map(np.testing.assert_array_equal, old_style, canonical)
    assert sorted(report.ignored) == [
        "cls.predictions.decoder.bias",
        "cls.predictions.decoder.weight",
        "embeddings.position_ids",
    ]
    assert report.initialized == ()


def _write_variant(source, target, tensors=None, config_changes=None):
    target.mkdir()
    safetensors_numpy.save_file(
        tensors if tensors is not None else _read_dir(source), target / hf.SAFE_WEIGHTS_NAME
    )
    cfg = json.loads((source / hf.CONFIG_NAME).read_text())
    cfg.update(config_changes or {})
    (target / hf.CONFIG_NAME).write_text(json.dumps(cfg))
    return target


def test_bad_checkpoints_name_the_tensor(tmp_path, hf_dir):
    source, _ = hf_dir
    tensors = _read_dir(source)

    bad = dict(
        tensors, **{"bert.encoder.layer.1.output.dense.weight": np.zeros((32, 47), np.float32)}
    )
    with pytest.raises(
        ValueError, match=r"bert\.encoder\.layer\.1\.output\.dense\.weight.*\(32, 47\)"
    ):
        bert_hf.load(_write_variant(source, tmp_path / "shape", bad))

    bad = {k: v for k, v in tensors.items() if k != "bert.encoder.layer.0.attention.self.key.bias"}
    with pytest.raises(
        ValueError, match=r"missing tensor 'bert\.encoder\.layer\.0\.attention\.self\.key\.bias'"
    ):
        bert_hf.load(_write_variant(source, tmp_path / "missing", bad))

    # A head that is half there is an error, not a silent re-initialisation.
    bad = {k: v for k, v in tensors.items() if k != "cls.seq_relationship.bias"}
    with pytest.raises(ValueError, match=r"missing tensor 'cls\.seq_relationship\.bias'"):
        bert_hf.load(_write_variant(source, tmp_path / "half_head", bad))

    bad = dict(tensors, **{"classifier.weight": np.zeros((3, 32), np.float32)})
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\) 'classifier\.weight'"):
        bert_hf.load(_write_variant(source, tmp_path / "unexpected", bad))

    # config.json says 1 layer: layer 1's tensors are unexpected.
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\) 'bert\.encoder\.layer\.1\."):
        bert_hf.load(
            _write_variant(source, tmp_path / "layers", config_changes={"num_hidden_layers": 1})
        )

    untied = tensors["bert.embeddings.word_embeddings.weight"] + 1
    bad = dict(tensors, **{"cls.predictions.decoder.weight": untied})
    with pytest.raises(ValueError, match=r"cls\.predictions\.decoder\.weight.*untied"):
        bert_hf.load(_write_variant(source, tmp_path / "untied", bad))


def test_bad_configs_and_overrides_are_refused(tmp_path, hf_dir):
    source, _ = hf_dir
    with pytest.raises(ValueError, match=r"hidden_act='relu'.*gelu_new"):
        bert_hf.load(
            _write_variant(source, tmp_path / "relu", config_changes={"hidden_act": "relu"})
        )
    with pytest.raises(ValueError, match=r"position_embedding_type='relative_key'"):
        bert_hf.load(
            _write_variant(
                source, tmp_path / "rel", config_changes={"position_embedding_type": "relative_key"}
            )
        )
    with pytest.raises(ValueError, match=r"override hidden_size=64 is not allowed"):
        bert_hf.load(source, hidden_size=64)
    with pytest.raises(ValueError, match=r"override 'no_such_field'"):
        bert_hf.load(source, no_such_field=1)
    with pytest.raises(FileNotFoundError, match="no weights found"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / hf.CONFIG_NAME).write_text((source / hf.CONFIG_NAME).read_text())
        bert_hf.load(tmp_path / "empty")
    config, _ = bert_hf.load(source, dtype="bfloat16", attention_impl="xla", remat_policy="full")
    assert (config.dtype, config.attention_impl, config.remat_policy) == ("bfloat16", "xla", "full")
    assert config.param_dtype == "float32"


@pytest.mark.parametrize("name", list(bert_config.PRESETS))
def test_preset_parameter_counts_match_transformers(name):
    config = BertConfig.preset(name)
    ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(_abstract_params(config)))
    with torch.device("meta"):
        theirs_model = transformers.BertForPreTraining(
            transformers.BertConfig(**bert_hf.config_to_hf(config))
        )
    theirs = sum(p.numel() for p in theirs_model.parameters())  # tied weights counted once
    assert ours == theirs
    assert (
        len(bert_hf.tensor_specs(config)) == len(theirs_model.state_dict()) - 2
    )  # less the tied decoder copies


# ---------------------------------------------------------------------------------------------
# Tokenizers in and out


def test_save_writes_the_tokenizer_transformers_reads(tmp_path, sentencepiece):
    config = BertConfig.preset(
        "tiny", vocab_size=sentencepiece.vocab_size, max_position_embeddings=24
    )
    bert_hf.save(config, _random_params(config, seed=10), tmp_path, tokenizer=sentencepiece)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
    }
    assert load_tokenizer(tmp_path).fingerprint == sentencepiece.fingerprint
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert theirs.model_max_length == 24 and theirs.mask_token == "[MASK]"
    texts = ["The assert statement.", "Paris is the [MASK] of France."]
    ours = sentencepiece.encode_batch(texts, special_tokens_in_text=True)
    assert theirs(texts)["input_ids"] == [[2, *ids, 3] for ids in ours]
    # Without a tokenizer, the weights alone, as before.
    bert_hf.save(config, _random_params(config, seed=10), tmp_path / "bare")
    assert {p.name for p in (tmp_path / "bare").iterdir()} == {"config.json", "model.safetensors"}


def test_load_tokenizer_reads_vocab_txt_with_its_casing(tmp_path):
    write_wordpiece_vocab(tmp_path / "vocab.txt", VARIED * 5, lowercase=False)
    # transformers' default for a bare vocab.txt is uncased; tokenizer_config.json says more.
    assert load_tokenizer(tmp_path).lowercase
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = load_tokenizer(tmp_path)
    assert not cased.lowercase and not cased.strip_accents
    reference = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = cased.encode_batch(VARIED, special_tokens_in_text=True)
    assert ours == reference(VARIED, add_special_tokens=False)["input_ids"]
    # tokenizer.json, when present, is read in preference: it says everything.
    uncased = WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt", lowercase=True)
    uncased.save(tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path).fingerprint == uncased.fingerprint
    # A vocabulary whose special tokens are not BERT's is refused by name.
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
    with pytest.raises(ValueError, match=r"mask_token='<mask>'"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer found"):
        load_tokenizer(tmp_path)
