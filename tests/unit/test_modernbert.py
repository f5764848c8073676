"""ModernBERT's encoder (bertjax.encoders.modernbert): parity with transformers' ModernBERT
(hidden states, MLM and classification logits, weights both ways), packed documents, the
initialisation, the config, and sharded == single-device on 8 simulated CPU devices."""

import dataclasses
import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.encoders.modernbert import attention as mb_attention
from bertjax.encoders.modernbert import family as mb_family
from bertjax.encoders.modernbert import layouts
from bertjax.encoders.modernbert import model as mb_model
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.encoders.modernbert.model import ModernBertModel
from bertjax.nn import sharding
from tests.helpers.modernbert import ALL_BIASES, ATOL, SEQ, SMALL, _apply, _batch
from tests.helpers.modernbert_reference import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
)
from tests.helpers.params import max_diff, random_init

# ---------------------------------------------------------------------------------------------
# transformers' side, built from a random config in float32 (no network).


# ---------------------------------------------------------------------------------------------
# Parity.


# ---------------------------------------------------------------------------------------------
# Weights both ways.


def test_scanned_stack_traces_the_same_program_for_any_depth():
    ids = np.zeros((1, 16), np.int32)
    sizes = []
    for num_layers in (4, 22):  # 1 + 1 * 3 and 1 + 7 * 3
        config = dataclasses.replace(SMALL, num_layers=num_layers, scan_layers=True)
        model = ModernBertModel(config)
        params = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), ids))["params"]
        jaxpr = jax.make_jaxpr(lambda p, m=model: m.apply({"params": p}, ids))(
            nn.meta.unbox(params)
        )
        sizes.append(len(jaxpr.jaxpr.eqns))
    assert sizes[0] == sizes[1]


def test_each_layer_materialises_its_gradient_and_changes_no_value(monkeypatch):
    """The encoder's backward pass computes the residual stream's gradient into memory at
    each layer (materialized_gradient: one conditional per layer in the CPU program) and
    gets the values of the fused program without it (to float rounding: the fusions differ,
    and with them where XLA contracts a multiply and an add)."""
    config = dataclasses.replace(SMALL, num_layers=2)
    ids, mask = _batch(config)
    model = ModernBertModel(config)
    params = jax.jit(model.init)(jax.random.key(0), ids, mask)["params"]

    def gradient_and_conditionals():
        def loss(params):
            return jnp.sum(_apply(model, params, ids, mask) ** 2)

        jax.clear_caches()  # traces of the layers are reused otherwise, with what they called
        grad = jax.jit(jax.grad(loss))
        program = grad.lower(params).compile().as_text()
        return grad(params), program.count(" conditional(")

    ours, ours_conditionals = gradient_and_conditionals()
    monkeypatch.setattr(mb_model, "materialized_gradient", lambda x: x)
    fused, fused_conditionals = gradient_and_conditionals()
    assert ours_conditionals - fused_conditionals == config.num_layers
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-10), ours, fused)
    assert all(np.abs(np.asarray(leaf)).max() > 0 for leaf in jax.tree.leaves(ours))


# ---------------------------------------------------------------------------------------------
# Packed documents.


def test_packed_documents_equal_each_document_alone():
    """Two documents in one row (segment ids, positions restarting) compute what each does
    alone; changing the first leaves the second's outputs unchanged."""
    rng = np.random.default_rng(7)
    ids = np.zeros((1, SEQ), np.int32)
    params = random_init(lambda: ModernBertModel(SMALL).init(jax.random.key(1), ids)["params"], 1)
    first, second = rng.integers(3, 99, 13), rng.integers(3, 99, 15)  # longer than the window

    def packed(a, b):
        pad = SEQ - len(a) - len(b)
        ids = np.concatenate([a, b, np.zeros(pad, int)])[None].astype(np.int32)  # [1, s]
        mask = (np.arange(SEQ) < len(a) + len(b)).astype(np.int32)[None]
        segments = np.concatenate([np.full(len(a), 1), np.full(len(b), 2), np.zeros(pad)])
        positions = np.concatenate([np.arange(len(a)), np.arange(len(b)), np.zeros(pad)])
        out = _apply(
            ModernBertModel(SMALL),
            params,
            ids,
            mask,
            segment_ids=segments[None].astype(np.int32),
            positions=positions[None].astype(np.int32),
        )
        return np.asarray(out)[0]

    def alone(a):
        ids = np.zeros((1, SEQ), np.int32)
        ids[0, : len(a)] = a
        mask = (np.arange(SEQ) < len(a)).astype(np.int32)[None]
        return np.asarray(_apply(ModernBertModel(SMALL), params, ids, mask))[0, : len(a)]

    out = packed(first, second)
    assert max_diff(out[:13], alone(first)) <= ATOL
    assert max_diff(out[13:28], alone(second)) <= ATOL

    changed = packed(rng.integers(3, 99, 13), second)
    assert max_diff(changed[13:28], out[13:28]) <= 1e-6
    assert max_diff(changed[:13], out[:13]) > 1e-2
    # Without segment ids the documents do see each other.
    ids = np.concatenate([first, second, np.zeros(4, int)])[None].astype(np.int32)
    mask = (np.arange(SEQ) < 28).astype(np.int32)[None]
    joined = np.asarray(_apply(ModernBertModel(SMALL), params, ids, mask))[0]
    assert max_diff(joined[13:28], alone(second)) > 1e-2


# ---------------------------------------------------------------------------------------------
# Initialisation and the config.


def _truncated_std(cutoff: float) -> float:
    """Standard deviation of a standard normal truncated at +-cutoff."""
    density = math.exp(-(cutoff**2) / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(cutoff / math.sqrt(2))
    return math.sqrt(1 - 2 * cutoff * density / mass)


def test_initialisation_follows_transformers_init_weights():
    config = dataclasses.replace(
        SMALL, vocab_size=2000, hidden_size=64, intermediate_size=128, num_layers=4, **ALL_BIASES
    )
    ids = np.zeros((1, 8), np.int32)
    mlm = nn.meta.unbox(
        jax.jit(ModernBertForMaskedLM(config).init)(jax.random.key(0), ids)["params"]
    )
    clf = ModernBertForSequenceClassification(config, 16)
    clf = nn.meta.unbox(jax.jit(clf.init)(jax.random.key(1), ids)["params"])
    std_in = config.initializer_range
    std_out = config.initializer_range / math.sqrt(2 * config.num_layers)
    groups = {
        "tok_embeddings": (std_in, [mlm["model"]["embeddings"]["tok_embeddings"]]),
        "wqkv": (std_in, []),
        "wi": (std_in, []),
        "attn wo": (std_out, []),
        "mlp wo": (std_out, []),
        "head dense": (std_out, [mlm["head"]["dense"]["kernel"]]),
        "classifier": (config.hidden_size**-0.5, [clf["classifier"]["kernel"]]),
    }
    for i in range(config.num_layers):
        layer = mlm["model"][f"layer_{i}"]
        groups["wqkv"][1].append(layer["attn"]["wqkv"]["kernel"])
        groups["wi"][1].append(layer["mlp"]["wi"]["kernel"])
        groups["attn wo"][1].append(layer["attn"]["wo"]["kernel"])
        groups["mlp wo"][1].append(layer["mlp"]["wo"]["kernel"])
    factor = _truncated_std(config.initializer_cutoff_factor)  # about 0.88
    for name, (std, arrays) in groups.items():
        values = np.concatenate([np.ravel(a) for a in arrays])
        assert abs(values.std() / (std * factor) - 1) < 0.1, (name, values.std(), std)
        assert abs(values.mean()) < 0.1 * std, name
        assert np.abs(values).max() <= config.initializer_cutoff_factor * std * (1 + 1e-6), name

    for tree in (mlm, clf):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            where = jax.tree_util.keystr(path)
            if "'scale'" in where:
                assert np.all(np.asarray(leaf) == 1), where
            elif "'bias'" in where or "decoder_bias" in where:
                assert np.all(np.asarray(leaf) == 0), where
    assert "attn_norm" not in mlm["model"]["layer_0"]  # layer 0's attention norm is the identity
    assert (
        "bias"
        not in jax.eval_shape(ModernBertModel(SMALL).init, jax.random.key(0), ids)["params"][
            "final_norm"
        ]
    )


def test_config_validates_and_converts():
    for change, message in [
        (dict(hidden_size=30), "hidden_size=30 is invalid"),
        (dict(hidden_size=36, num_heads=12), "hidden_size=36 is invalid: .* even size"),
        (dict(local_attention=0), "local_attention=0 is invalid"),
        (dict(global_attn_every_n_layers=1.5), "global_attn_every_n_layers=1.5 is invalid"),
        (dict(global_rope_theta=-1.0), "global_rope_theta=-1.0 is invalid"),
        (dict(mlp_dropout=1.0), r"mlp_dropout=1.0 is invalid: must be in \[0, 1\)"),
        (dict(attention_bias=1), "attention_bias=1 is invalid: must be True or False"),
        (dict(classifier_pooling="max"), "classifier_pooling='max' is invalid"),
        (dict(dtype="float64"), "dtype='float64' is invalid"),
        (dict(pad_token_id=99), r"pad_token_id=99 is invalid: must be an id in \[0, vocab"),
    ]:
        with pytest.raises(ValueError, match=f"^ModernBertConfig.{message}"):
            dataclasses.replace(SMALL, **change)

    assert ModernBertConfig().window == 64
    assert [SMALL.is_global(i) for i in range(4)] == [True, False, False, True]
    base = ModernBertConfig.preset("base")
    assert (base.hidden_size, base.num_layers, base.intermediate_size) == (768, 22, 1152)
    assert ModernBertConfig.preset("large", dtype="float32").num_layers == 28
    with pytest.raises(ValueError, match="unknown ModernBERT preset 'huge'"):
        ModernBertConfig.preset("huge")

    assert ModernBertConfig.from_hf_dict(SMALL.to_hf_dict(), dtype="float32") == SMALL
    # The hub's answerdotai/ModernBERT-base config.json is in the older form; keys that
    # carry nothing for the architecture (position_embedding_type, ...) are ignored.
    hub_base = {
        "architectures": ["ModernBertForMaskedLM"],
        "model_type": "modernbert",
        "vocab_size": 50368,
        "hidden_size": 768,
        "intermediate_size": 1152,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "max_position_embeddings": 8192,
        "global_attn_every_n_layers": 3,
        "local_attention": 128,
        "global_rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "hidden_activation": "gelu",
        "classifier_pooling": "mean",
        "norm_eps": 1e-05,
        "norm_bias": False,
        "pad_token_id": 50283,
        "cls_token_id": 50281,
        "sep_token_id": 50282,
        "position_embedding_type": "absolute",
        "reference_compile": True,
    }
    assert ModernBertConfig.from_hf_dict(hub_base) == ModernBertConfig.preset("base")
    old_style = {
        "model_type": "modernbert",
        "num_hidden_layers": 5,
        "global_attn_every_n_layers": 2,
        "global_rope_theta": 5.0,
        "local_rope_theta": 7.0,
    }
    old = ModernBertConfig.from_hf_dict(old_style)
    assert (old.num_layers, old.global_attn_every_n_layers) == (5, 2)
    assert (old.global_rope_theta, old.local_rope_theta) == (5.0, 7.0)
    with pytest.raises(ValueError, match="layer_types=.* is not supported"):
        ModernBertConfig.from_hf_dict({"layer_types": ["sliding_attention"] * 3})
    with pytest.raises(ValueError, match="hidden_activation='silu' is not supported"):
        ModernBertConfig.from_hf_dict({"hidden_activation": "silu"})


# ---------------------------------------------------------------------------------------------
# Numerics, remat, dropout.


def test_bfloat16_compute_stays_close_to_float32():
    ids, mask = _batch()
    model32 = ModernBertForMaskedLM(SMALL)
    params = random_init(lambda: model32.init(jax.random.key(2), ids, mask)["params"], 2, 0.02)
    ref = np.asarray(_apply(model32, params, ids, mask))
    bf16 = ModernBertForMaskedLM(dataclasses.replace(SMALL, dtype="bfloat16"))
    out = _apply(bf16, params, ids, mask)
    assert out.dtype == jnp.float32
    assert max_diff(out, ref, mask.astype(bool)) < 0.05 * np.abs(ref).max()
    hidden = _apply(
        ModernBertModel(dataclasses.replace(SMALL, dtype="bfloat16")), params["model"], ids
    )
    assert hidden.dtype == jnp.bfloat16


def test_bfloat16_matmuls_keep_float32_activations_padded_and_unpadded():
    """matmul_dtype bfloat16 on a float32 ModernBERT, its global and local layers, padded and
    with its real tokens packed: the products' operands are rounded (the logits move off
    float32's, less than a bfloat16 model's), the hidden states and gradients stay float32,
    and the packed path equals the padded one on real tokens."""
    ids, mask = _batch()
    model32 = ModernBertForMaskedLM(SMALL)
    params = random_init(lambda: model32.init(jax.random.key(2), ids, mask)["params"], 2, 0.02)
    ref = np.asarray(_apply(model32, params, ids, mask))
    mixed = ModernBertForMaskedLM(dataclasses.replace(SMALL, matmul_dtype="bfloat16"))
    low = ModernBertForMaskedLM(dataclasses.replace(SMALL, dtype="bfloat16"))
    out = np.asarray(_apply(mixed, params, ids, mask))
    real = mask.astype(bool)
    assert 0 < max_diff(out, ref, real) < max_diff(_apply(low, params, ids, mask), ref, real)
    encoder = ModernBertModel(dataclasses.replace(SMALL, matmul_dtype="bfloat16"))
    hidden = _apply(encoder, params["model"], ids, mask)
    assert hidden.dtype == jnp.float32
    packed = encoder.apply({"params": params["model"]}, ids, mask, packed_length=int(mask.sum()))
    assert max_diff(packed, hidden, real) < 1e-5

    def loss(model, p):
        return jnp.sum(jnp.where(real[..., None], model.apply({"params": p}, ids, mask), 0) ** 2)

    got = jax.jit(jax.grad(functools.partial(loss, mixed)))(params)
    want = jax.jit(jax.grad(functools.partial(loss, model32)))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == jnp.float32
        assert np.abs(np.asarray(g) - np.asarray(w)).max() < 0.05 * (np.abs(np.asarray(w)).max())


def test_remat_and_dropout():
    ids, mask = _batch()
    # Layer 0, then one scanned group of a global and a local layer.
    config = dataclasses.replace(
        SMALL,
        num_layers=3,
        global_attn_every_n_layers=2,
        embedding_dropout=0.1,
        attention_dropout=0.1,
        mlp_dropout=0.1,
    )
    model = ModernBertForMaskedLM(config)
    params = random_init(lambda: model.init(jax.random.key(3), ids)["params"], 3, std=0.02)

    def loss(p, cfg, rng):
        logits = ModernBertForMaskedLM(cfg).apply(
            {"params": p}, ids, mask, deterministic=False, rngs={"dropout": rng}
        )
        return jnp.mean(jax.nn.log_softmax(logits)[..., 5])

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    scanned = dataclasses.replace(config, scan_layers=True)
    scanned_params = {**params, "model": layouts.stack_layers(params["model"], scanned)}
    for cfg, p, policies in [
        (config, params, ("full",)),
        (scanned, scanned_params, ("dots",)),
    ]:
        value, grads = grad(p, cfg, jax.random.key(4))
        for policy in policies:
            remat_value, remat_grads = grad(
                p, dataclasses.replace(cfg, remat_policy=policy), jax.random.key(4)
            )
            assert abs(float(remat_value - value)) <= 1e-6, (policy, cfg.scan_layers)
            diffs = jax.tree.map(lambda a, b: max_diff(a, b), remat_grads, grads)
            assert max(jax.tree.leaves(diffs)) <= 1e-6, (policy, cfg.scan_layers)

    # Dropout draws from the rng; deterministic runs ignore the rates.
    value, _ = grad(params, config, jax.random.key(4))
    other, _ = grad(params, config, jax.random.key(5))
    assert float(other) != float(value)
    deterministic = _apply(ModernBertForMaskedLM(config), params, ids, mask)
    no_dropout = dataclasses.replace(
        config, embedding_dropout=0.0, attention_dropout=0.0, mlp_dropout=0.0
    )
    assert (
        max_diff(deterministic, _apply(ModernBertForMaskedLM(no_dropout), params, ids, mask)) == 0
    )


# ---------------------------------------------------------------------------------------------
# Sharding on 8 simulated devices.


def _is_box(x):
    return isinstance(x, nn.Partitioned)


def test_every_parameter_has_a_logical_spec():
    ids = np.zeros((1, 8), np.int32)
    ruled = {name for name, _ in sharding.LOGICAL_RULES} | {None}
    config = dataclasses.replace(SMALL, **ALL_BIASES)
    scanned = dataclasses.replace(config, scan_layers=True)
    for module in (
        ModernBertForMaskedLM(config),
        ModernBertForSequenceClassification(config, 2),
        ModernBertForMaskedLM(scanned),
    ):
        boxed = jax.eval_shape(lambda m=module: m.init(jax.random.key(0), ids))["params"]
        leaves = jax.tree_util.tree_leaves_with_path(boxed, is_leaf=_is_box)
        for path, leaf in leaves:
            where = jax.tree_util.keystr(path)
            assert _is_box(leaf), f"{where} has no partitioning annotation"
            assert len(leaf.names) == leaf.value.ndim, where
            assert set(leaf.names) <= ruled, f"{where} uses names outside the rules: {leaf.names}"
            if "'groups'" in where:
                assert leaf.names[0] == sharding.LAYERS, where


@pytest.mark.parametrize("scan_layers", [False, True])
def test_sharded_forward_equals_single_device(scan_layers):
    assert jax.device_count() == 8
    ids, mask = _batch(lengths=(SEQ, 20, 9, 31, 5, 17, 32, 12))  # 8 rows
    model = ModernBertForMaskedLM(dataclasses.replace(SMALL, scan_layers=scan_layers))
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, mask))["params"]
    rng = np.random.default_rng(8)
    params = jax.tree.map(
        lambda x: jnp.asarray(0.2 * rng.standard_normal(x.shape), x.dtype), nn.meta.unbox(boxed)
    )
    forward = lambda p, i, m: model.apply({"params": p}, i, m)  # noqa: E731
    ref = np.asarray(jax.jit(forward)(params, ids, mask))

    for shape in [(1, 2, 4)] if scan_layers else [(8, 1, 1), (2, 2, 2), (1, 2, 4)]:
        mesh = sharding.make_mesh(shape)
        param_shardings = sharding.logical_shardings(boxed, mesh)
        sharded_params = jax.device_put(params, param_shardings)
        batch = jax.device_put((ids, mask), sharding.batch_sharding(mesh))
        with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_RULES):
            out = jax.jit(forward)(sharded_params, *batch)
        if (
            shape == (1, 2, 4) and not scan_layers
        ):  # [h, 3, n, d]: hidden over fsdp, heads over tensor
            wqkv = sharded_params["model"]["layer_1"]["attn"]["wqkv"]["kernel"]
            assert {s.data.shape for s in wqkv.addressable_shards} == {(16, 3, 1, 8)}
        if shape == (1, 2, 4) and scan_layers:  # [groups, h, 3, n, d]
            wqkv = sharded_params["model"]["groups"]["layer_0"]["attn"]["wqkv"]["kernel"]
            assert {s.data.shape for s in wqkv.addressable_shards} == {(1, 16, 3, 1, 8)}
        rows = {s.data.shape[0] for s in out.addressable_shards}
        assert rows == {8 // sharding.data_parallel_size(mesh)}, shape  # the batch stays split
        # On one device CPU attention is blocked, sharded it is the einsum path: a padded
        # query's row differs between them (nothing reads it), real tokens agree.
        assert max_diff(out, ref, np.asarray(mask, bool)) <= 1e-5, shape


def test_chunked_local_attention_equals_the_whole_row_mask(monkeypatch):
    """Local layers of rows longer than three windows attend by chunks; on the real tokens
    they give what the whole-row local mask gives, with padding and packed documents."""
    assert mb_attention.is_banded(SEQ, SMALL.window) and not mb_attention.is_banded(
        3 * SMALL.window, SMALL.window
    )
    model = ModernBertModel(SMALL)
    ids, mask = _batch(lengths=(SEQ, 27, 13), seq=SEQ, seed=5)
    segments = np.where(np.arange(SEQ)[None] < 11, 1, 2) * mask  # two documents per row
    params = random_init(lambda: model.init(jax.random.key(3), ids, mask)["params"], 4, 0.05)
    chunked = np.asarray(_apply(model, params, ids, mask, segment_ids=segments))
    monkeypatch.setattr(mb_attention, "is_banded", lambda seq, window: False)
    whole = np.asarray(_apply(model, params, ids, mask, segment_ids=segments))
    real = mask.astype(bool)
    assert max_diff(chunked[real], whole[real]) < ATOL
    assert np.abs(whole[real]).mean() > 0.1


# ---------------------------------------------------------------------------------------------
# Fused attention kernels (bertjax.nn.attention): splash runs in Pallas interpret mode on CPU.

KERNEL_SEQ = 256  # splash needs a multiple of 128
# Layers 0 and 2 global, layer 1 local with a window of +-64 (banded on the einsum path at
# 256 tokens); scanned, the group is layers 1 and 2.
KERNEL_CONFIG = dataclasses.replace(
    SMALL,
    num_layers=3,
    global_attn_every_n_layers=2,
    num_heads=2,
    max_position_embeddings=KERNEL_SEQ,
    local_attention=128,
)
# Row 0: three documents filling the row; row 1: two documents, then padding.
KERNEL_DOCUMENTS = ((90, 100, 66), (120, 80))


def _kernel_batch(packed: bool):
    """ids and mask [2, KERNEL_SEQ] (row 1 padded after 200 tokens) and, packed, the segment
    ids (0-based, as any ints may be; padding 0 too) and positions restarting per document."""
    ids, mask = _batch(KERNEL_CONFIG, lengths=(KERNEL_SEQ, 200), seq=KERNEL_SEQ, seed=11)
    if not packed:
        return ids, mask, {}
    segments = np.zeros(ids.shape, np.int32)
    positions = np.zeros(ids.shape, np.int32)
    for row, lengths in enumerate(KERNEL_DOCUMENTS):
        starts = np.cumsum((0,) + lengths)
        for doc, (start, end) in enumerate(zip(starts[:-1], starts[1:])):
            segments[row, start:end] = doc
            positions[row, start:end] = np.arange(end - start)
    return ids, mask, dict(segment_ids=segments, positions=positions)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed_scanned_remat"])
def test_splash_attention_equals_the_einsum_path(packed):
    """attention_impl="splash" gives the einsum path's hidden states and gradients on real
    tokens: global and local (window) layers, padding and packed documents, and (packed)
    under nn.scan and remat."""
    config = KERNEL_CONFIG
    if packed:
        config = dataclasses.replace(config, scan_layers=True, remat_policy="dots")
    ids, mask, documents = _kernel_batch(packed)
    model = ModernBertModel(config)
    params = random_init(lambda: model.init(jax.random.key(5), ids[:, :8])["params"], 6, 0.05)
    # A loss over real tokens only: padded rows differ between the paths and nothing reads them.
    weights = np.random.default_rng(12).standard_normal(ids.shape + (config.hidden_size,))
    weights = jnp.asarray(weights * mask[..., None], jnp.float32)

    def loss_and_hidden(impl):
        impl_model = ModernBertModel(dataclasses.replace(config, attention_impl=impl))

        def loss(p):
            hidden = impl_model.apply({"params": p}, ids, mask, **documents)
            return jnp.sum(hidden * weights), hidden

        return loss

    assert "pallas_call" in str(jax.make_jaxpr(loss_and_hidden("splash"))(params))
    assert "pallas_call" not in str(jax.make_jaxpr(loss_and_hidden("xla"))(params))
    (_, einsum_hidden), einsum_grads = jax.jit(
        jax.value_and_grad(loss_and_hidden("xla"), has_aux=True)
    )(params)
    (_, splash_hidden), splash_grads = jax.jit(
        jax.value_and_grad(loss_and_hidden("splash"), has_aux=True)
    )(params)
    real = mask.astype(bool)
    assert max_diff(splash_hidden[real], einsum_hidden[real]) <= ATOL
    assert np.abs(np.asarray(einsum_hidden)[real]).mean() > 0.1
    for path, einsum_grad in jax.tree_util.tree_leaves_with_path(einsum_grads):
        splash_grad = functools.reduce(lambda node, key: node[key.key], path, splash_grads)
        scale = max(1.0, float(np.abs(np.asarray(einsum_grad)).max()))
        assert max_diff(splash_grad, einsum_grad) <= ATOL * scale, jax.tree_util.keystr(path)


def test_layer_masks_send_each_kind_of_layer_to_the_kernel_that_serves_it(monkeypatch, caplog):
    from bertjax.nn import attention

    monkeypatch.setattr(attention, "_logged", set())  # each reason logged anew here
    ids, mask, documents = _kernel_batch(packed=True)
    segments = documents["segment_ids"]
    config = dataclasses.replace(KERNEL_CONFIG, dtype="bfloat16", attention_impl="cudnn")

    # CPU, "xla": the einsum path's masks, exactly as before the option existed.
    cpu = dataclasses.replace(config, attention_impl="xla")
    masks = mb_attention.layer_masks(cpu, mask, segments, deterministic=True)
    expected = mb_attention.attention_masks(mask, segments, cpu.window)
    for got, want in zip(masks, expected):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # CPU, "auto" or "blocked": both kinds of layer on the blocked path (documents and
    # windows), in training too; with attention dropout in training, the einsum path.
    for impl in ("auto", "blocked"):
        cpu = dataclasses.replace(config, attention_impl=impl)
        global_mask, local_mask = mb_attention.layer_masks(cpu, mask, segments, deterministic=True)
        assert isinstance(global_mask, mb_attention.KernelMasks) and local_mask is global_mask
        global_mask, local_mask = mb_attention.layer_masks(cpu, mask, segments, deterministic=False)
        assert isinstance(global_mask, mb_attention.KernelMasks)
        assert isinstance(local_mask, mb_attention.KernelMasks) and local_mask is global_mask
        dropping = dataclasses.replace(cpu, attention_dropout=0.1)
        masks = mb_attention.layer_masks(dropping, mask, segments, deterministic=False)
        assert not any(isinstance(m, mb_attention.KernelMasks) for m in masks)

    # An NVIDIA GPU in bf16: cuDNN serves global layers (padding as sequence lengths); it
    # takes no two-sided window and no documents, so those layers keep the einsum path.
    monkeypatch.setattr(attention, "_platform", lambda: "nvidia")
    with caplog.at_level(logging.INFO, logger="bertjax.nn.attention"):
        global_mask, local_mask = mb_attention.layer_masks(config, mask, None, deterministic=True)
    assert isinstance(global_mask, mb_attention.KernelMasks) and global_mask.document_ids is None
    assert not isinstance(local_mask, mb_attention.KernelMasks) and local_mask.ndim == 4  # banded
    assert "'cudnn' falls back to xla" in caplog.text and "two-sided window" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bertjax.nn.attention"):
        masks = mb_attention.layer_masks(config, mask, segments, deterministic=True)
    assert not any(isinstance(m, mb_attention.KernelMasks) for m in masks)
    assert "each token's document" in caplog.text
    auto = dataclasses.replace(config, attention_impl="auto")
    assert isinstance(
        mb_attention.layer_masks(auto, mask, None, deterministic=True)[0], mb_attention.KernelMasks
    )

    # A TPU: splash serves both kinds, documents as ids 1.. and padding as 0.
    monkeypatch.setattr(attention, "_platform", lambda: "tpu")
    global_mask, local_mask = mb_attention.layer_masks(auto, mask, segments, deterministic=True)
    assert isinstance(global_mask, mb_attention.KernelMasks) and local_mask is global_mask
    np.testing.assert_array_equal(
        np.asarray(global_mask.document_ids), np.where(mask == 1, segments + 1, 0)
    )
    # Attention dropout in training: the kernels cannot drop weights, the einsum path runs.
    dropping = dataclasses.replace(auto, attention_dropout=0.1)
    masks = mb_attention.layer_masks(dropping, mask, segments, deterministic=False)
    assert not any(isinstance(m, mb_attention.KernelMasks) for m in masks)
    assert isinstance(
        mb_attention.layer_masks(dropping, mask, segments, deterministic=True)[0],
        mb_attention.KernelMasks,
    )


def test_attention_impl_is_a_runtime_field_not_a_transformers_one():

    assert SMALL.attention_impl == "auto"
    splash = dataclasses.replace(SMALL, attention_impl="splash")
    assert "attention_impl" not in splash.to_hf_dict()
    assert ModernBertConfig.from_hf_dict(splash.to_hf_dict(), dtype="float32") == SMALL
    assert ModernBertConfig.from_hf_dict(SMALL.to_hf_dict(), attention_impl="splash") == (
        dataclasses.replace(splash, dtype="bfloat16")
    )
    with pytest.raises(ValueError, match=r"attention_impl='flash' is invalid: must be one of"):
        dataclasses.replace(SMALL, attention_impl="flash")

    family = mb_family.FAMILY
    assert "attention_impl" not in family.architecture_fields  # a checkpoint opens with any
    assert family.config_from_dict(family.config_to_dict(splash)) == splash
    for impl in ("auto", "xla", "blocked", "cudnn", "splash"):
        config = family.from_settings("tiny", {"attention_impl": impl, "hidden_dropout": 0.0})
        assert config.attention_impl == impl
        assert family.with_overrides(SMALL, {"attention_impl": impl}).attention_impl == impl
