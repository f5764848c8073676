"""The parity tests of test_modernbert.py (tests/unit/), with its helpers."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.encoders.modernbert import hf as mb_hf
from bertjax.encoders.modernbert import layouts
from bertjax.encoders.modernbert import model as mb_model
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.encoders.modernbert.model import ModernBertModel
from tests.helpers import modernbert_reference as mb_ref
from tests.helpers.modernbert import (
    ALL_BIASES,
    ATOL,
    LOGITS_ATOL,
    SEQ,
    SMALL,
    _apply,
    _batch,
    _hf_config,
    _hf_model,
    _run_torch,
    _state_dict,
    _torch,
)
from tests.helpers.modernbert_reference import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
)
from tests.helpers.params import max_diff


@pytest.mark.parametrize("biases", [{}, ALL_BIASES], ids=["no_biases", "all_biases"])
def test_hidden_states_equal_transformers(biases):
    config = dataclasses.replace(SMALL, **biases)
    hf = _hf_model("ModernBertModel", config)
    params = mb_ref.params_from_hf(_state_dict(hf), config)
    ids, mask = _batch(config)
    theirs = _run_torch(hf, ids, mask).last_hidden_state.numpy()
    ours = np.asarray(_apply(ModernBertModel(config), params, ids, mask))
    real = mask.astype(bool)
    assert ours.shape == theirs.shape == (3, SEQ, config.hidden_size)
    assert max_diff(ours, theirs, real) <= ATOL
    assert np.abs(theirs[real]).mean() > 0.5  # real numbers, not two sets of zeros

    # The sliding windows matter here: the same weights with one window spanning the whole
    # sequence compute something else.
    wide = dataclasses.replace(config, local_attention=2 * SEQ)
    assert max_diff(_apply(ModernBertModel(wide), params, ids, mask), theirs, real) > 1e-2


def test_masked_lm_logits_equal_transformers():
    hf = _hf_model("ModernBertForMaskedLM", SMALL, seed=1)
    params = mb_ref.params_from_hf(_state_dict(hf), SMALL)
    assert set(params) == {"model", "head", "decoder_bias"}
    ids, mask = _batch()
    theirs = _run_torch(hf, ids, mask).logits.numpy()
    model = ModernBertForMaskedLM(SMALL)
    ours = np.asarray(_apply(model, params, ids, mask))
    real = mask.astype(bool)
    assert ours.shape == theirs.shape == (3, SEQ, SMALL.vocab_size)
    assert ours.dtype == np.float32
    assert max_diff(ours, theirs, real) <= LOGITS_ATOL
    assert np.abs(theirs[real]).mean() > 0.5

    # At given positions only: the same logits as the full ones there.
    positions = np.array([[0, 5, 31], [3, 19, 7], [8, 1, 2]], np.int32)
    some = np.asarray(_apply(model, params, ids, mask, positions))
    assert some.shape == (3, 3, SMALL.vocab_size)
    # Not bit-equal: the head's matmuls over [b, p, h] and [b, s, h] may sum in another order
    # (about 10 float32 ulps at logits near 1 on some CPUs).
    assert max_diff(some, np.take_along_axis(ours, positions[..., None], axis=1)) <= 1e-5


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classification_logits_equal_transformers(pooling):
    config = dataclasses.replace(SMALL, classifier_pooling=pooling, classifier_bias=True)
    hf = _hf_model("ModernBertForSequenceClassification", config, seed=2, num_labels=3)
    params = mb_ref.params_from_hf(_state_dict(hf), config)
    ids, mask = _batch(config)
    theirs = _run_torch(hf, ids, mask).logits.numpy()
    ours = np.asarray(_apply(ModernBertForSequenceClassification(config, 3), params, ids, mask))
    assert ours.shape == theirs.shape == (3, 3)
    assert max_diff(ours, theirs) <= ATOL


def test_packed_rotary_positions_equal_transformers_position_ids():
    """Our `positions` are transformers' position_ids: the same rotary phase per token."""
    hf = _hf_model("ModernBertModel", SMALL, seed=3)
    params = mb_ref.params_from_hf(_state_dict(hf), SMALL)
    ids, mask = _batch(SMALL, lengths=(SEQ, SEQ, SEQ))
    positions = np.tile(np.arange(SEQ)[::-1] + 7, (3, 1)).astype(np.int32)
    torch, _ = _torch()
    theirs = _run_torch(hf, ids, mask, position_ids=torch.from_numpy(positions).long())
    ours = _apply(ModernBertModel(SMALL), params, ids, mask, positions=positions)
    assert max_diff(ours, theirs.last_hidden_state.numpy()) <= ATOL


@pytest.mark.parametrize(
    "cls_name,biases",
    [
        ("ModernBertForMaskedLM", {}),
        ("ModernBertForMaskedLM", {**ALL_BIASES, "decoder_bias": False}),
        ("ModernBertModel", ALL_BIASES),
        ("ModernBertForSequenceClassification", {}),
    ],
)
def test_hf_params_hf_round_trip_is_exact(cls_name, biases):
    config = dataclasses.replace(SMALL, **biases)
    extra = {"num_labels": 5} if "Classification" in cls_name else {}
    sd = _state_dict(_hf_model(cls_name, config, seed=4, **extra))
    back = mb_ref.params_to_hf(mb_ref.params_from_hf(sd, config), config)
    assert set(back) == set(sd)
    for name, array in sd.items():
        assert back[name].dtype == array.dtype, name
        assert np.array_equal(back[name], array), name


def test_transformers_loads_our_weights_strictly_and_agrees():
    torch, transformers = _torch()
    config = dataclasses.replace(SMALL, **ALL_BIASES)
    ids, mask = _batch(config)
    model = ModernBertForMaskedLM(config)
    params = jax.jit(model.init)(jax.random.key(0), ids, mask)["params"]  # boxed
    # Norms and biases random too, so that a swapped one would show.
    rng = np.random.default_rng(5)
    params = jax.tree.map(
        lambda x: jnp.asarray(x + 0.2 * rng.standard_normal(x.shape), x.dtype),
        nn.meta.unbox(params),
    )
    ours = np.asarray(_apply(model, params, ids, mask))

    hf = transformers.ModernBertForMaskedLM(_hf_config(config)).eval()
    state = {name: torch.from_numpy(a) for name, a in mb_ref.params_to_hf(params, config).items()}
    result = hf.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert hf.decoder.weight.data_ptr() == hf.model.embeddings.tok_embeddings.weight.data_ptr()
    theirs = _run_torch(hf, ids, mask).logits.numpy()
    assert max_diff(ours, theirs, mask.astype(bool)) <= LOGITS_ATOL


def test_bad_state_dicts_name_the_tensor():
    sd = _state_dict(_hf_model("ModernBertForMaskedLM", SMALL, seed=6))
    wqkv = "model.layers.2.attn.Wqkv.weight"

    missing = {k: v for k, v in sd.items() if k != wqkv}
    with pytest.raises(
        ValueError, match=rf"tensor '{wqkv}' is missing \(expected shape \(96, 32\)\)"
    ):
        mb_ref.params_from_hf(missing, SMALL)
    with pytest.raises(ValueError, match=rf"tensor '{wqkv}' has shape \(32, 96\), expected"):
        mb_ref.params_from_hf({**sd, wqkv: sd[wqkv].T}, SMALL)
    with pytest.raises(ValueError, match=r"\['model.layers.1.attn.Wqkv.bias'\] are not parameters"):
        mb_ref.params_from_hf(
            {**sd, "model.layers.1.attn.Wqkv.bias": np.zeros(96, np.float32)}, SMALL
        )
    # A checkpoint with more layers than the config says.
    with pytest.raises(ValueError, match=r"'model.layers.3.attn_norm.weight'.*are not parameters"):
        mb_ref.params_from_hf(sd, dataclasses.replace(SMALL, num_layers=3))
    untied = {**sd, "decoder.weight": sd["decoder.weight"] + 1}
    with pytest.raises(ValueError, match="'decoder.weight' differs .* untied decoder"):
        mb_ref.params_from_hf(untied, SMALL)

    params = mb_ref.params_from_hf(sd, SMALL)
    del params["model"]["layer_1"]["mlp"]["wi"]
    with pytest.raises(ValueError, match=r"params have no model/layer_1/mlp/wi/kernel"):
        mb_ref.params_to_hf(params, SMALL)


def test_scanned_layer_groups_equal_transformers_and_round_trip():
    """Layer 0, two scanned groups of (local, local, global), one local tail layer."""
    config = dataclasses.replace(SMALL, num_layers=8, scan_layers=True, **ALL_BIASES)
    assert mb_model.group_layout(config) == (2, 1)
    hf = _hf_model("ModernBertForMaskedLM", config, seed=9)
    sd = _state_dict(hf)
    params = mb_ref.params_from_hf(sd, config)
    assert sorted(params["model"]) == ["embeddings", "final_norm", "groups", "layer_0", "layer_7"]
    assert params["model"]["groups"]["layer_2"]["attn"]["wqkv"]["kernel"].shape == (2, 32, 3, 4, 8)
    ids, mask = _batch(config)
    theirs = _run_torch(hf, ids, mask).logits.numpy()
    ours = _apply(ModernBertForMaskedLM(config), params, ids, mask)
    assert max_diff(ours, theirs, mask.astype(bool)) <= LOGITS_ATOL
    back = mb_ref.params_to_hf(params, config)
    assert set(back) == set(sd) and all(np.array_equal(back[k], sd[k]) for k in sd)
    restacked = layouts.stack_layers(layouts.unstack_layers(params["model"], config), config)
    assert jax.tree.all(jax.tree.map(np.array_equal, restacked, params["model"]))
    plain = dataclasses.replace(config, scan_layers=False)
    plain_out = _apply(ModernBertForMaskedLM(plain), mb_ref.params_from_hf(sd, plain), ids, mask)
    assert max_diff(plain_out, ours) <= 1e-6


def test_config_round_trips_through_transformers():
    _, transformers = _torch()
    for config in (
        SMALL,
        ModernBertConfig.preset("base"),
        dataclasses.replace(SMALL, **ALL_BIASES),
    ):
        hf = transformers.ModernBertConfig(**config.to_hf_dict())
        assert hf.layer_types == config.to_hf_dict()["layer_types"]
        assert hf.sliding_window == config.window
        back = ModernBertConfig.from_hf_dict(hf.to_dict(), dtype=config.dtype)
        assert back == config


@pytest.mark.parametrize("name", ["base", "large"])
def test_preset_parameter_counts_match_transformers(name):
    torch, transformers = _torch()
    config = ModernBertConfig.preset(name)
    ids = np.zeros((1, 8), np.int32)
    abstract = jax.eval_shape(lambda: ModernBertForMaskedLM(config).init(jax.random.key(0), ids))
    ours = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(abstract)))
    with torch.device("meta"):
        theirs_model = transformers.ModernBertForMaskedLM(_hf_config(config))
    theirs = sum(p.numel() for p in theirs_model.parameters())  # the tied decoder counted once
    assert ours == theirs
    assert ours // 10**6 == {"base": 149, "large": 395}[name]  # the hub's 149M and 395M
    assert len(mb_hf.tensor_specs(config)) == len(theirs_model.state_dict()) - 1  # less the tie
