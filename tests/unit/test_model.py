"""BERT modules: shapes, heads, padding, presets, config validation, dropout, precision, layouts."""

import contextlib
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.encoders.bert.config import ARCHITECTURE_FIELDS, PRESETS, BertConfig
from bertjax.encoders.bert.model import (
    BertForPreTraining,
    BertModel,
    sinusoidal_table,
    stack_layers,
    unstack_layers,
)
from bertjax.nn import sharding
from bertjax.nn.unpadding import (
    first_tokens,
    pack_tokens,
    packing_index,
    tokens_per_group,
    unpack_tokens,
)
from tests.helpers.batches import padded_batch, second_segment
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.params import count_params

CFG = dataclasses.replace(
    SMALL_BERT, vocab_size=99, num_heads=4, max_position_embeddings=32, attention_impl="xla"
)
BATCH, SEQ, PREDS = 2, 16, 3


def _batch():
    lengths = [11, SEQ]  # BATCH rows
    input_ids, mask = padded_batch(
        lengths, SEQ, vocab_size=CFG.vocab_size, first_word=5, cls_id=None
    )
    token_types = second_segment(mask, 6)
    positions = np.array([[1, 4, 9], [0, 7, 15]], np.int32)
    return input_ids, token_types, mask, positions


def _apply(config, params, *args, deterministic=True, rngs=None, **kwargs):
    return BertForPreTraining(config).apply(
        {"params": params}, *args, deterministic=deterministic, rngs=rngs, **kwargs
    )


_jit_apply = jax.jit(_apply, static_argnums=0, static_argnames="deterministic")


@pytest.fixture(scope="module")
def params():
    ids, types, mask, _ = _batch()
    variables = jax.jit(BertForPreTraining(CFG).init)(jax.random.PRNGKey(0), ids, types, mask)
    return nn.meta.unbox(variables["params"])


def test_output_shapes_and_dtypes(params):
    ids, types, mask, positions = _batch()
    out = _jit_apply(CFG, params, ids, types, mask, positions)
    assert out.sequence_output.shape == (BATCH, SEQ, CFG.hidden_size)
    assert out.pooled_output.shape == (BATCH, CFG.hidden_size)
    assert out.mlm_logits.shape == (BATCH, PREDS, CFG.vocab_size)
    assert out.nsp_logits.shape == (BATCH, 2)
    full = _jit_apply(CFG, params, ids)  # omitted inputs take BERT's defaults
    assert full.mlm_logits.shape == (BATCH, SEQ, CFG.vocab_size)
    assert full.mlm_logits.dtype == full.nsp_logits.dtype == jnp.float32
    # BertModel on its own reads the same parameters under "bert".
    seq, pooled = jax.jit(BertModel(CFG).apply)({"params": params["bert"]}, ids, types, mask)
    np.testing.assert_array_equal(np.asarray(seq), np.asarray(out.sequence_output))
    np.testing.assert_array_equal(np.asarray(pooled), np.asarray(out.pooled_output))


def test_omitted_inputs_default_like_bert(params):
    ids, _, _, _ = _batch()
    zeros, ones = np.zeros_like(ids), np.ones_like(ids)
    a = _jit_apply(CFG, params, ids)
    b = _jit_apply(CFG, params, ids, zeros, ones)
    np.testing.assert_allclose(np.asarray(a.mlm_logits), np.asarray(b.mlm_logits), atol=1e-6)


def test_masked_positions_equal_gathered_full_logits(params):
    ids, types, mask, positions = _batch()
    gathered = _jit_apply(CFG, params, ids, types, mask, positions).mlm_logits
    full = _jit_apply(CFG, params, ids, types, mask).mlm_logits
    expected = np.take_along_axis(np.asarray(full), positions[..., None], axis=1)
    np.testing.assert_allclose(np.asarray(gathered), expected, atol=1e-5)


def test_padding_invariance(params):
    ids, types, mask, positions = _batch()
    other_ids = np.where(mask == 1, ids, 77)  # different tokens at the padded positions
    other_types = np.where(mask == 1, types, 1)
    a = _jit_apply(CFG, params, ids, types, mask, positions)
    b = _jit_apply(CFG, params, other_ids, other_types, mask, positions)
    real = mask.astype(bool)
    assert not np.array_equal(other_ids, ids)
    np.testing.assert_allclose(
        np.asarray(a.sequence_output)[real], np.asarray(b.sequence_output)[real], atol=1e-5
    )
    for name in ("pooled_output", "mlm_logits", "nsp_logits"):  # positions are all real
        np.testing.assert_allclose(
            np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), atol=1e-5
        )


def test_decoder_is_tied_to_word_embeddings(params):
    ids, types, mask, positions = _batch()
    unused = 3  # no input uses token 3
    assert not (ids == unused).any()
    before = _jit_apply(CFG, params, ids, types, mask, positions).mlm_logits
    bumped = jax.tree.map(lambda x: x, params)
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    # A random direction: a constant shift would vanish against the LayerNorm'd features.
    shift = np.random.default_rng(1).standard_normal(CFG.hidden_size).astype(np.float32)
    bumped["bert"]["embeddings"]["word_embeddings"]["embedding"] = table.at[unused].add(shift)
    after = _jit_apply(CFG, bumped, ids, types, mask, positions).mlm_logits
    changed = np.abs(np.asarray(after) - np.asarray(before)).max(axis=(0, 1))
    assert changed[unused] > 1e-3
    assert np.all(np.delete(changed, unused) < 1e-6)


def _expected_count(c: BertConfig) -> int:
    h, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    embeddings = (v + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    pooler = h * h + h
    heads = (h * h + h) + 2 * h + v + (h * 2 + 2)
    return embeddings + c.num_layers * layer + pooler + heads


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_counts(name):
    config = BertConfig.preset(name)
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(BertForPreTraining(config).init, jax.random.PRNGKey(0), ids)
    assert count_params(shapes["params"]) == _expected_count(config)
    if name == "base":
        assert count_params(shapes["params"]) == 110_106_428  # bert-base-uncased, pretraining heads


def test_presets_have_documented_sizes():
    sizes = {n: (p["num_layers"], p["hidden_size"], p["num_heads"]) for n, p in PRESETS.items()}
    assert sizes == {
        "tiny": (2, 128, 2),
        "mini": (4, 256, 4),
        "small": (4, 512, 8),
        "medium": (8, 512, 8),
        "base": (12, 768, 12),
        "large": (24, 1024, 16),
    }
    assert all(p["intermediate_size"] == 4 * p["hidden_size"] for p in PRESETS.values())
    assert BertConfig.preset("base") == BertConfig()
    assert BertConfig.preset("tiny", dtype="bfloat16").dtype == "bfloat16"


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(hidden_size=100, num_heads=12), "hidden_size=100"),
        (dict(num_layers=0), "num_layers=0"),
        (dict(vocab_size=-5), "vocab_size=-5"),
        (dict(hidden_size=64.0, num_heads=4), "hidden_size=64.0"),
        (dict(hidden_dropout=1.0), "hidden_dropout=1.0"),
        (dict(attention_dropout=-0.1), "attention_dropout=-0.1"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps=0.0"),
        (dict(hidden_act="relu"), "hidden_act='relu'.*gelu_tanh"),
        (dict(position_embedding_type="rotary"), "position_embedding_type='rotary'.*sinusoidal"),
        (dict(dtype="float64"), "dtype='float64'.*bfloat16"),
        (dict(param_dtype="int8"), "param_dtype='int8'"),
        (dict(matmul_dtype="float64"), "matmul_dtype='float64'.*None"),
        (dict(attention_impl="flash"), "attention_impl='flash'.*splash"),
        (dict(remat_policy="some"), "remat_policy='some'.*dots"),
        (dict(scan_layers="yes"), "scan_layers='yes'"),
        (dict(head_init="xavier"), "head_init='xavier'.*lecun_normal"),
    ],
)
def test_config_validation(overrides, field):
    with pytest.raises(ValueError, match=field):
        BertConfig(**overrides)


def test_config_dict_round_trip_and_errors():
    config = BertConfig.preset("mini", dtype="bfloat16", scan_layers=True)
    assert BertConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="hiden_size"):
        BertConfig.from_dict({**config.to_dict(), "hiden_size": 3})
    with pytest.raises(ValueError, match="'huge'.*tiny"):
        BertConfig.preset("huge")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 4  # type: ignore[misc]


def test_sequence_longer_than_positions_is_an_error(params):
    ids = np.ones((1, CFG.max_position_embeddings + 1), np.int32)
    with pytest.raises(ValueError, match="max_position_embeddings=32"):
        _apply(CFG, params, ids)


def test_dropout_only_when_not_deterministic(params):
    ids, types, mask, positions = _batch()
    det = _jit_apply(CFG, params, ids, types, mask, positions)
    train = [
        _jit_apply(
            CFG,
            params,
            ids,
            types,
            mask,
            positions,
            deterministic=False,
            rngs={"dropout": jax.random.PRNGKey(seed)},
        ).mlm_logits
        for seed in (1, 2)
    ]
    assert np.abs(np.asarray(train[0]) - np.asarray(det.mlm_logits)).max() > 1e-3
    assert np.abs(np.asarray(train[0]) - np.asarray(train[1])).max() > 1e-3
    # With both rates at zero, training mode computes the same function.
    no_drop = dataclasses.replace(CFG, hidden_dropout=0.0, attention_dropout=0.0)
    same = _jit_apply(
        no_drop,
        params,
        ids,
        types,
        mask,
        positions,
        deterministic=False,
        rngs={"dropout": jax.random.PRNGKey(1)},
    )
    np.testing.assert_allclose(np.asarray(same.mlm_logits), np.asarray(det.mlm_logits), atol=1e-6)


def test_bfloat16_compute_float32_params_and_logits(params):
    ids, types, mask, positions = _batch()
    bf16 = dataclasses.replace(CFG, dtype="bfloat16")
    variables = jax.eval_shape(BertForPreTraining(bf16).init, jax.random.PRNGKey(0), ids)
    assert {x.dtype for x in jax.tree.leaves(nn.meta.unbox(variables))} == {jnp.dtype("float32")}
    out = _jit_apply(bf16, params, ids, types, mask, positions)
    ref = _jit_apply(CFG, params, ids, types, mask, positions)
    assert out.sequence_output.dtype == jnp.bfloat16
    assert out.mlm_logits.dtype == out.nsp_logits.dtype == jnp.float32
    assert np.abs(np.asarray(out.mlm_logits) - np.asarray(ref.mlm_logits)).max() < 0.1


def test_bfloat16_matmuls_keep_float32_activations_and_gradients(params):
    """matmul_dtype bfloat16 on a float32 model: every product's operands are rounded (the
    outputs move off float32's), nothing else is (activations, logits and gradients stay
    float32, closer to float32's than a bfloat16 model's)."""
    ids, types, mask, positions = _batch()
    mixed = dataclasses.replace(CFG, matmul_dtype="bfloat16")
    bf16 = dataclasses.replace(CFG, dtype="bfloat16")
    out = _jit_apply(mixed, params, ids, types, mask, positions)
    ref = _jit_apply(CFG, params, ids, types, mask, positions)
    low = _jit_apply(bf16, params, ids, types, mask, positions)
    assert out.sequence_output.dtype == jnp.float32
    error = np.abs(np.asarray(out.mlm_logits) - np.asarray(ref.mlm_logits)).max()
    bf16_error = np.abs(np.asarray(low.mlm_logits) - np.asarray(ref.mlm_logits)).max()
    assert 0 < error < 0.05 and error < bf16_error

    def loss(config, p):
        out = _apply(config, p, ids, types, mask, positions)
        return jnp.sum(out.mlm_logits**2) * 1e-3 + jnp.sum(out.nsp_logits)

    got = jax.jit(jax.grad(functools.partial(loss, mixed)))(params)
    want = jax.jit(jax.grad(functools.partial(loss, CFG)))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == jnp.float32
        scale = np.abs(np.asarray(w)).max() + 1e-6
        assert np.abs(np.asarray(g) - np.asarray(w)).max() < 0.05 * scale


def test_initialisation_follows_bert(params):
    kernel = np.asarray(params["bert"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"])
    table = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    for w in (kernel, table):
        assert np.abs(w).max() <= 2 * CFG.initializer_range  # truncated at 2 stddev
    # TF-style truncation without rescaling: std = 0.88 * stddev.
    assert 0.8 * CFG.initializer_range < table.std() < 0.95 * CFG.initializer_range
    layer = params["bert"]["encoder"]["layer_1"]
    assert np.all(np.asarray(layer["attention"]["query"]["bias"]) == 0)
    assert np.all(np.asarray(layer["mlp"]["layer_norm"]["scale"]) == 1)
    assert np.all(np.asarray(params["mlm_head"]["output_bias"]) == 0)


HEAD_KERNELS = (("mlm_head", "transform", "kernel"), ("nsp_head", "kernel"))


def _leaves(tree):
    return {
        tuple(k.key for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def test_lecun_head_init_scales_only_the_head_kernels(params):
    # The default stays google's: the head kernels are truncated normals of initializer_range.
    assert CFG.head_init == "truncated_normal"
    for path in HEAD_KERNELS:
        kernel = _leaves(params)[path]
        assert np.abs(kernel).max() <= 2 * CFG.initializer_range
    ids, types, mask, _ = _batch()
    lecun = dataclasses.replace(CFG, head_init="lecun_normal")
    variables = jax.jit(BertForPreTraining(lecun).init)(jax.random.PRNGKey(0), ids, types, mask)
    default, opted = _leaves(params), _leaves(nn.meta.unbox(variables["params"]))
    assert default.keys() == opted.keys()
    for path, value in default.items():
        if path in HEAD_KERNELS:
            # Variance 1/fan_in (flax rescales its truncated normal to keep it exact).
            fan_in = value.shape[0]
            assert opted[path].std() == pytest.approx(fan_in**-0.5, rel=0.3)
            assert opted[path].std() > 3 * value.std()
        else:  # everything else, the same draw bit for bit
            np.testing.assert_array_equal(opted[path], value, err_msg=str(path))


def test_head_init_round_trips_and_is_not_architecture():
    config = BertConfig.preset("tiny", head_init="lecun_normal")
    assert BertConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    # Only where the weights start differs, not what they mean: checkpoints and exports
    # of either initialisation are interchangeable.
    assert "head_init" not in ARCHITECTURE_FIELDS


def test_sinusoidal_positions_have_no_parameter(params):
    table = sinusoidal_table(4, 6)
    np.testing.assert_allclose(table[1, :2], [np.sin(1.0), np.cos(1.0)], rtol=1e-6)
    angle = 2 / 10000 ** (2 / 6)  # position 2, second frequency
    np.testing.assert_allclose(table[2, 2:4], [np.sin(angle), np.cos(angle)], rtol=1e-6)
    sin_cfg = dataclasses.replace(CFG, position_embedding_type="sinusoidal")
    sin_params = {**params, "bert": {**params["bert"]}}
    sin_params["bert"]["embeddings"] = {
        k: v for k, v in params["bert"]["embeddings"].items() if k != "position_embeddings"
    }
    ids, types, mask, _ = _batch()
    shapes = jax.eval_shape(BertForPreTraining(sin_cfg).init, jax.random.PRNGKey(0), ids)
    assert "position_embeddings" not in shapes["params"]["bert"]["embeddings"]
    # Identical tokens everywhere: only the position table can tell the rows apart.
    same = np.full((1, SEQ), 9, np.int32)
    out = np.asarray(_jit_apply(sin_cfg, sin_params, same).sequence_output)[0]
    assert np.isfinite(out).all()
    assert np.abs(out[1:] - out[:1]).max(axis=-1).min() > 1e-3


def _loss_and_grads(config, params, ids, types, mask, positions):
    def loss(p):
        out = _apply(config, p, ids, types, mask, positions)
        return jnp.sum(out.mlm_logits**2) * 1e-3 + jnp.sum(out.nsp_logits)

    return jax.jit(jax.value_and_grad(loss))(params)


def test_scan_and_remat_match_the_plain_stack(params):
    ids, types, mask, positions = _batch()
    # Without dropout: scan draws per-layer dropout rngs differently from the plain stack.
    plain = dataclasses.replace(CFG, hidden_dropout=0.0, attention_dropout=0.0)
    plain_loss, plain_grads = _loss_and_grads(plain, params, ids, types, mask, positions)
    remat = dataclasses.replace(plain, remat_policy="dots")
    loss, grads = _loss_and_grads(remat, params, ids, types, mask, positions)
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, plain_grads)

    stacked = stack_layers(params, CFG.num_layers)
    assert set(stacked["bert"]["encoder"]) == {"layers"}
    q = stacked["bert"]["encoder"]["layers"]["attention"]["query"]["kernel"]
    assert q.shape == (
        CFG.num_layers,
        CFG.hidden_size,
        CFG.num_heads,
        CFG.hidden_size // CFG.num_heads,
    )
    scan = dataclasses.replace(plain, scan_layers=True, remat_policy="full")
    loss, grads = _loss_and_grads(scan, stacked, ids, types, mask, positions)
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    grads = unstack_layers(grads, CFG.num_layers)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, plain_grads)


def test_scan_init_tree_matches_stacked_plain_tree():
    ids = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)
    scan_cfg = dataclasses.replace(CFG, scan_layers=True)
    plain = jax.eval_shape(BertForPreTraining(CFG).init, jax.random.PRNGKey(0), ids)["params"]
    scanned = jax.eval_shape(BertForPreTraining(scan_cfg).init, jax.random.PRNGKey(0), ids)[
        "params"
    ]
    is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731
    # Boxed trees convert too, and the logical names gain the leading "layers" axis.
    restacked = stack_layers(plain, CFG.num_layers)
    to_shape = lambda t: jax.tree.map(lambda x: (x.value.shape, x.names), t, is_leaf=is_box)  # noqa: E731
    assert to_shape(restacked) == to_shape(scanned)
    assert to_shape(unstack_layers(scanned, CFG.num_layers)) == to_shape(plain)
    with pytest.raises(ValueError, match="layer_0"):
        stack_layers(plain, CFG.num_layers + 1)


# ----------------------------------------------------------------------------- token packing


def test_packing_index_pack_and_unpack():
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.int32)
    index = np.asarray(packing_index(jnp.asarray(mask), 6, groups=2))
    # Group 0 holds rows 0-1 (8 positions), group 1 rows 2-3; unused slots point past the end.
    np.testing.assert_array_equal(index, [[0, 1, 2, 4, 5, 8], [0, 4, 5, 6, 7, 8]])
    np.testing.assert_array_equal(tokens_per_group(jnp.asarray(mask), 2), [5, 5])
    x = jnp.arange(4 * 4 * 3, dtype=jnp.float32).reshape(4, 4, 3) + 1
    packed = pack_tokens(x, jnp.asarray(index))
    assert packed.shape == (2, 6, 3)
    np.testing.assert_array_equal(packed[0, :5], np.asarray(x)[:2][mask[:2] == 1])
    restored = np.asarray(unpack_tokens(packed, jnp.asarray(index), 4, 4))
    np.testing.assert_array_equal(restored, np.asarray(x) * mask[..., None])


def _packing_batch():
    rng = np.random.default_rng(3)
    batch, seq = 8, SEQ
    lengths = rng.integers(4, seq + 1, batch)
    lengths[0] = seq
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(5, CFG.vocab_size, (batch, seq)), 0).astype(np.int32)
    types = ((np.arange(seq)[None] >= (lengths // 2)[:, None]) & (mask == 1)).astype(np.int32)
    positions = np.stack(
        [np.sort(rng.choice(np.arange(1, n), PREDS, replace=False)) for n in lengths]
    )
    return ids, types, mask, positions.astype(np.int32)


@pytest.mark.parametrize("mesh_shape", [None, (4, 1, 2), (2, 2, 2)])
@pytest.mark.parametrize("scan", [False, True])
def test_token_packing_matches_the_padded_model(params, mesh_shape, scan):
    ids, types, mask, positions = _packing_batch()
    config = dataclasses.replace(CFG, scan_layers=scan, remat_policy="full" if scan else "none")
    weights = stack_layers(params, CFG.num_layers) if scan else params

    def loss_and_grads(packed_length):
        def loss(p):
            out = _apply(config, p, ids, types, mask, positions, packed_length=packed_length)
            return jnp.sum(out.mlm_logits**2) * 1e-3 + jnp.sum(out.nsp_logits), out

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(weights)

    mesh = sharding.make_mesh(mesh_shape) if mesh_shape else None
    with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
        groups = sharding.shards(sharding.BATCH)
        needed = int(np.max(tokens_per_group(jnp.asarray(mask), groups)))
        assert needed < mask.size // groups  # there is padding to skip
        (plain_loss, plain), plain_grads = loss_and_grads(None)
        (loss, packed), grads = loss_and_grads(needed)
    assert groups == (mesh_shape[0] * mesh_shape[1] if mesh_shape else 1)
    # The loss (about -0.004) is a sum of larger terms that nearly cancel, so one rounding of a
    # term (7e-9 was seen, one float32 step at 0.1) is 2e-6 of it: allow that absolute step.
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6, atol=1e-7)
    real = mask.astype(bool)
    np.testing.assert_allclose(
        np.asarray(packed.sequence_output)[real], np.asarray(plain.sequence_output)[real], atol=1e-5
    )
    assert not np.asarray(packed.sequence_output)[~real].any()  # padding is zero when packed
    for name in ("pooled_output", "mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(getattr(packed, name), getattr(plain, name), atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, plain_grads)


@pytest.mark.parametrize(
    "mesh_shape, packed, remat, scan",
    [
        (None, False, "none", False),
        (None, True, "dots", False),
        ((4, 1, 2), True, "none", False),
        ((2, 2, 2), False, "full", True),
        (None, True, "none", True),
    ],
)
def test_cls_only_gives_the_pooled_output_and_gradients_of_the_whole_model(
    params, mesh_shape, packed, remat, scan
):
    ids, types, mask, _ = _packing_batch()
    config = dataclasses.replace(CFG, remat_policy=remat, scan_layers=scan)
    weights = params["bert"]
    if scan:
        weights = stack_layers(weights, CFG.num_layers)
    direction = np.random.default_rng(5).normal(size=(ids.shape[0], CFG.hidden_size))

    def pooled_and_grads(cls_only):
        def project(p, packed_length):
            sequence, pooled = BertModel(config).apply(
                {"params": p},
                ids,
                types,
                mask,
                packed_length=packed_length,
                cls_only=cls_only,
            )
            return jnp.sum(pooled * direction), (sequence, pooled)

        groups = sharding.shards(sharding.BATCH)
        packed_length = int(np.max(tokens_per_group(jnp.asarray(mask), groups))) if packed else None
        grad = jax.grad(project, has_aux=True)
        return jax.jit(grad, static_argnums=1)(weights, packed_length)

    mesh = sharding.make_mesh(mesh_shape) if mesh_shape else None
    with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
        full_grads, (full_sequence, full_pooled) = pooled_and_grads(False)
        grads, (cls_sequence, pooled) = pooled_and_grads(True)
    assert cls_sequence.shape == (ids.shape[0], 1, CFG.hidden_size)
    np.testing.assert_allclose(cls_sequence, np.asarray(full_sequence)[:, :1], atol=1e-5)
    np.testing.assert_allclose(pooled, full_pooled, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, full_grads)


def test_first_tokens_finds_each_rows_cls_among_packed_tokens():
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.int32)
    x = jnp.arange(4 * 4 * 3, dtype=jnp.float32).reshape(4, 4, 3) + 1
    index = packing_index(jnp.asarray(mask), 6, groups=2)
    packed = pack_tokens(x, index)
    np.testing.assert_array_equal(first_tokens(packed, jnp.asarray(mask), index), x[:, :1])
    np.testing.assert_array_equal(first_tokens(x, jnp.asarray(mask), None), x[:, :1])
