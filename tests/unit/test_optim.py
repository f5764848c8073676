"""Schedules, weight-decay mask, AdamW/LAMB against numpy references, clipping, validation."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.engine import optim

H, N, D, F, V, P, T, L = 4, 2, 2, 6, 11, 8, 2, 2


def _contract_params():
    """The BertForPreTraining parameter tree of the interface contract, tiny sizes."""
    rng = np.random.default_rng(0)

    def arr(*shape):
        return rng.normal(size=shape).astype(np.float32)

    def ln():
        return {"scale": arr(H), "bias": arr(H)}

    def layer():
        return {
            "attention": {
                "query": {"kernel": arr(H, N, D), "bias": arr(N, D)},
                "key": {"kernel": arr(H, N, D), "bias": arr(N, D)},
                "value": {"kernel": arr(H, N, D), "bias": arr(N, D)},
                "output": {"kernel": arr(N, D, H), "bias": arr(H)},
                "layer_norm": ln(),
            },
            "mlp": {
                "intermediate": {"kernel": arr(H, F), "bias": arr(F)},
                "output": {"kernel": arr(F, H), "bias": arr(H)},
                "layer_norm": ln(),
            },
        }

    return {
        "bert": {
            "embeddings": {
                "word_embeddings": {"embedding": arr(V, H)},
                "position_embeddings": {"embedding": arr(P, H)},
                "token_type_embeddings": {"embedding": arr(T, H)},
                "layer_norm": ln(),
            },
            "encoder": {f"layer_{i}": layer() for i in range(L)},
            "pooler": {"kernel": arr(H, H), "bias": arr(H)},
        },
        "mlm_head": {
            "transform": {"kernel": arr(H, H), "bias": arr(H)},
            "layer_norm": ln(),
            "output_bias": arr(V),
        },
        "nsp_head": {"kernel": arr(H, 2), "bias": arr(2)},
    }


def _stack(params):
    """Scanned-encoder layout: layer_i subtrees stacked on a leading axis under "layers"."""
    encoder = params["bert"]["encoder"]
    layers = [encoder[f"layer_{i}"] for i in range(L)]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    return {**params, "bert": {**params["bert"], "encoder": {"layers": stacked}}}


def _expected_decay(path) -> bool:
    keys = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
    return keys[-1] in ("kernel", "embedding")


def _box(tree):
    return jax.tree.map(lambda x: nn.Partitioned(x, names=(None,) * x.ndim), tree)


# --------------------------------------------------------------------------- schedules


def _lr(schedule, step):
    return float(schedule(step))


def test_linear_schedule_exact_values():
    s = optim.OptimizerSettings(
        learning_rate=1e-3,
        warmup_steps=100,
        total_steps=1100,
        end_learning_rate=1e-5,
        schedule="linear",
    )
    f = optim.make_schedule(s)
    assert _lr(f, 0) == 0.0
    assert _lr(f, 25) == pytest.approx(2.5e-4, rel=1e-6)
    assert _lr(f, 100) == pytest.approx(1e-3, rel=1e-6)
    assert _lr(f, 600) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5, rel=1e-6)
    assert _lr(f, 1100) == pytest.approx(1e-5, rel=1e-6)
    assert _lr(f, 10**7) == pytest.approx(1e-5, rel=1e-6)


def test_polynomial_and_cosine_schedules_exact_values():
    common = dict(learning_rate=2e-3, warmup_steps=200, total_steps=1000, end_learning_rate=0.0)
    poly = optim.make_schedule(optim.OptimizerSettings(schedule="polynomial", **common))
    assert _lr(poly, 100) == pytest.approx(1e-3, rel=1e-6)
    assert _lr(poly, 200) == pytest.approx(2e-3, rel=1e-6)
    assert _lr(poly, 400) == pytest.approx(2e-3 * math.sqrt(0.75), rel=1e-6)
    assert _lr(poly, 1000) == 0.0
    assert _lr(poly, 5000) == 0.0
    cubic = optim.make_schedule(
        optim.OptimizerSettings(schedule="polynomial", polynomial_power=3.0, **common)
    )
    assert _lr(cubic, 600) == pytest.approx(2e-3 * 0.5**3, rel=1e-6)

    cos = optim.make_schedule(
        optim.OptimizerSettings(schedule="cosine", **{**common, "end_learning_rate": 1e-4})
    )
    assert _lr(cos, 50) == pytest.approx(5e-4, rel=1e-6)
    assert _lr(cos, 200) == pytest.approx(2e-3, rel=1e-6)
    assert _lr(cos, 400) == pytest.approx(1e-4 + 1.9e-3 * (1 + math.cos(math.pi / 4)) / 2, rel=1e-6)
    assert _lr(cos, 600) == pytest.approx(1e-4 + 1.9e-3 * 0.5, rel=1e-6)
    assert _lr(cos, 1000) == pytest.approx(1e-4, rel=1e-6)
    assert _lr(cos, 3000) == pytest.approx(1e-4, rel=1e-6)


def test_google_schedule_matches_google_research_bert():
    # google-research/bert: polynomial_decay(init_lr, step, T, end=0, power=1) from step 0,
    # replaced by init_lr * step / W while step < W.
    s = optim.OptimizerSettings(
        learning_rate=1e-4, warmup_steps=100, total_steps=1000, schedule="google"
    )
    f = optim.make_schedule(s)
    assert _lr(f, 0) == 0.0
    assert _lr(f, 1) == pytest.approx(1e-6, rel=1e-6)
    assert _lr(f, 99) == pytest.approx(0.99e-4, rel=1e-6)
    assert _lr(f, 100) == pytest.approx(1e-4 * (1 - 100 / 1000), rel=1e-6)  # lr * (1 - W/T)
    assert _lr(f, 500) == pytest.approx(0.5e-4, rel=1e-6)
    assert _lr(f, 999) == pytest.approx(1e-7, rel=1e-4)
    assert _lr(f, 1000) == 0.0
    assert _lr(f, 123456) == 0.0


def test_constant_schedule_and_edge_cases():
    const = optim.make_schedule(
        optim.OptimizerSettings(
            learning_rate=3e-4, warmup_steps=10, total_steps=20, schedule="constant"
        )
    )
    assert _lr(const, 5) == pytest.approx(1.5e-4, rel=1e-6)
    assert _lr(const, 10) == pytest.approx(3e-4, rel=1e-6)
    assert _lr(const, 10**6) == pytest.approx(3e-4, rel=1e-6)
    # No warmup: the first update uses the peak rate.
    nowarm = optim.make_schedule(
        optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=10)
    )
    assert _lr(nowarm, 0) == pytest.approx(1e-3, rel=1e-6)
    assert _lr(nowarm, 5) == pytest.approx(5e-4, rel=1e-6)
    # Warmup spanning the whole run: after it there is nothing left but the end rate.
    allwarm = optim.make_schedule(
        optim.OptimizerSettings(
            learning_rate=1e-3, warmup_steps=10, total_steps=10, end_learning_rate=1e-6
        )
    )
    assert _lr(allwarm, 9) == pytest.approx(9e-4, rel=1e-6)
    assert _lr(allwarm, 10) == pytest.approx(1e-6, rel=1e-6)
    # Works on int32 steps under jit, vectorised.
    steps = jnp.arange(0, 30, 5, dtype=jnp.int32)
    np.testing.assert_allclose(
        jax.jit(const)(steps), [0, 1.5e-4, 3e-4, 3e-4, 3e-4, 3e-4], rtol=1e-6
    )


# --------------------------------------------------------------------------- mask


def test_weight_decay_mask_on_contract_tree_plain_boxed_and_stacked():
    params = _contract_params()
    mask = optim.weight_decay_mask(params)
    flat = jax.tree_util.tree_flatten_with_path(mask)[0]
    assert len(flat) == len(jax.tree.leaves(params))
    for path, decays in flat:
        assert decays == _expected_decay(path), jax.tree_util.keystr(path)
    assert mask["mlm_head"]["output_bias"] is False
    assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"] is True
    assert mask["bert"]["embeddings"]["layer_norm"]["scale"] is False
    assert mask["bert"]["encoder"]["layer_1"]["attention"]["value"]["kernel"] is True
    assert mask["bert"]["encoder"]["layer_1"]["attention"]["value"]["bias"] is False
    assert mask["bert"]["encoder"]["layer_0"]["mlp"]["layer_norm"]["scale"] is False
    assert sum(jax.tree.leaves(mask)) == 3 + L * 6 + 3  # embeddings, kernels, heads

    boxed_mask = optim.weight_decay_mask(_box(params))
    assert isinstance(boxed_mask["nsp_head"]["kernel"], nn.Partitioned)
    assert jax.tree.leaves(nn.meta.unbox(boxed_mask)) == jax.tree.leaves(mask)

    stacked = _stack(params)
    stacked_mask = optim.weight_decay_mask(stacked)
    assert stacked_mask["bert"]["encoder"]["layers"]["mlp"]["intermediate"]["kernel"] is True
    assert stacked_mask["bert"]["encoder"]["layers"]["mlp"]["layer_norm"]["bias"] is False


# --------------------------------------------------------------------------- numpy references


def _np_adam_moments(g, m, v, t, s):
    m = s.b1 * m + (1 - s.b1) * g
    v = s.b2 * v + (1 - s.b2) * g * g
    mhat = m / (1 - s.b1**t)
    vhat = v / (1 - s.b2**t)
    return mhat / (np.sqrt(vhat) + s.eps), m, v


def _np_reference(params, grads_per_step, s, lamb=False, clip=None, stacked_leaves=()):
    """Plain-numpy AdamW/LAMB over a flat dict of arrays, names decide the decay mask."""
    p = {k: np.asarray(x, np.float64) for k, x in params.items()}
    m = {k: np.zeros_like(x) for k, x in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    sched = optim.make_schedule(s)
    for t, grads in enumerate(grads_per_step, start=1):
        g = {k: np.asarray(x, np.float64) for k, x in grads.items()}
        if clip:
            norm = math.sqrt(sum(float(np.sum(x * x)) for x in g.values()))
            if norm > clip:
                g = {k: x * clip / norm for k, x in g.items()}
        lr = float(sched(t - 1))
        for k in p:
            u, m[k], v[k] = _np_adam_moments(g[k], m[k], v[k], t, s)
            decays = not ("bias" in k or "layer_norm" in k)
            if decays:
                u = u + s.weight_decay * p[k]
                if lamb:
                    if k in stacked_leaves:
                        ratios = []
                        for i in range(p[k].shape[0]):
                            wn, un = np.linalg.norm(p[k][i]), np.linalg.norm(u[i])
                            ratios.append(wn / un if wn > 0 and un > 0 else 1.0)
                        u = u * np.reshape(ratios, (-1,) + (1,) * (u.ndim - 1))
                    else:
                        wn, un = np.linalg.norm(p[k]), np.linalg.norm(u)
                        u = u * (wn / un if wn > 0 and un > 0 else 1.0)
            p[k] = p[k] - lr * u
    return p


def _run(tx, params, grads_per_step):
    """Initialises the optimizer and applies it once per gradient, as one compiled program."""

    @jax.jit
    def run(params, grads_per_step):
        state = tx.init(params)
        for grads in grads_per_step:
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        return params

    return run(params, grads_per_step)


def _tiny_tree(rng):
    return {
        "dense/kernel": rng.normal(size=(3, 4)).astype(np.float32),
        "dense/bias": rng.normal(size=(4,)).astype(np.float32),
        "layer_norm/scale": (1 + 0.1 * rng.normal(size=(4,))).astype(np.float32),
        "zero/kernel": np.zeros((2, 2), np.float32),  # trust ratio 1 for LAMB
    }


def _grads(rng, tree, scale=1.0):
    return {k: (scale * rng.normal(size=x.shape)).astype(np.float32) for k, x in tree.items()}


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_two_steps_match_numpy_reference(name):
    rng = np.random.default_rng(1)
    params = _tiny_tree(rng)
    grads = [_grads(rng, params), _grads(rng, params, scale=0.1)]
    s = optim.OptimizerSettings(
        name=name,
        learning_rate=1e-2,
        warmup_steps=0,
        total_steps=10,
        weight_decay=0.1,
        max_grad_norm=None,
    )
    got = _run(optim.make_optimizer(s), {k: jnp.asarray(x) for k, x in params.items()}, grads)
    want = _np_reference(params, grads, s, lamb=name == "lamb")
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7, err_msg=k)
    # The step really moved every parameter, the zero kernel included.
    for k in params:
        assert not np.allclose(got[k], params[k]), k


def test_lamb_trust_ratio_scales_decayed_tensors_only():
    # With a single step, Adam's direction is sign(g) (up to eps); LAMB rescales decayed
    # tensors to step length lr * ||w|| while excluded tensors keep Adam's step.
    rng = np.random.default_rng(2)
    params = _tiny_tree(rng)
    grads = [_grads(rng, params)]
    s = optim.OptimizerSettings(
        name="lamb",
        learning_rate=0.1,
        warmup_steps=0,
        total_steps=10,
        weight_decay=0.0,
        max_grad_norm=None,
    )
    got = _run(optim.make_optimizer(s), params, grads)
    step = {k: np.asarray(got[k]) - params[k] for k in params}
    np.testing.assert_allclose(
        np.linalg.norm(step["dense/kernel"]),
        0.1 * np.linalg.norm(params["dense/kernel"]),
        rtol=1e-5,
    )
    np.testing.assert_allclose(np.abs(step["dense/bias"]), 0.1, rtol=1e-4)
    np.testing.assert_allclose(np.abs(step["layer_norm/scale"]), 0.1, rtol=1e-4)
    np.testing.assert_allclose(np.abs(step["zero/kernel"]), 0.1, rtol=1e-4)


def _layered_tree(rng):
    """A small encoder-shaped tree: unrolled layer_i subtrees plus unstacked neighbours."""

    def layer():
        return {
            "dense": {
                "kernel": rng.normal(size=(3, 4)).astype(np.float32),
                "bias": rng.normal(size=(4,)).astype(np.float32),
            },
            "layer_norm": {"scale": np.ones((4,), np.float32)},
        }

    return {
        "bert": {
            "encoder": {f"layer_{i}": layer() for i in range(L)},
            "pooler": {"kernel": rng.normal(size=(4, 4)).astype(np.float32)},
        }
    }


def test_lamb_is_per_layer_for_scanned_layers():
    rng = np.random.default_rng(3)
    params = _layered_tree(rng)
    # Layers with very different gradient scales: one trust ratio over the stack would
    # give them the wrong step lengths.
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    grads["bert"]["encoder"]["layer_1"]["dense"]["kernel"] *= 50.0
    s = optim.OptimizerSettings(
        name="lamb", learning_rate=1e-2, warmup_steps=0, total_steps=10, max_grad_norm=None
    )
    tx = optim.make_optimizer(s)
    unrolled = _run(tx, params, [grads, grads])
    scanned = _run(tx, _stack(params), [_stack(grads)] * 2)
    for a, b in zip(jax.tree.leaves(_stack(unrolled)), jax.tree.leaves(scanned)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)

    # And both equal the numpy reference that takes one trust ratio per layer.
    flat = {
        jax.tree_util.keystr(k): x
        for k, x in jax.tree_util.tree_flatten_with_path(_stack(params))[0]
    }
    flat_grads = {
        jax.tree_util.keystr(k): x
        for k, x in jax.tree_util.tree_flatten_with_path(_stack(grads))[0]
    }
    want = _np_reference(
        flat, [flat_grads] * 2, s, lamb=True, stacked_leaves={k for k in flat if "'layers'" in k}
    )
    for (_, got), key in zip(jax.tree_util.tree_flatten_with_path(scanned)[0], flat):
        np.testing.assert_allclose(got, want[key], rtol=2e-5, atol=1e-7, err_msg=key)


def test_boxed_params_give_the_same_update():
    rng = np.random.default_rng(5)
    params = _layered_tree(rng)
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    for name in ("adamw", "lamb"):
        s = optim.OptimizerSettings(name=name, learning_rate=1e-2, warmup_steps=0, total_steps=10)
        tx = optim.make_optimizer(s)
        plain = _run(tx, params, [grads])
        boxed = _run(tx, _box(params), [_box(grads)])
        assert isinstance(boxed["bert"]["pooler"]["kernel"], nn.Partitioned)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(nn.meta.unbox(boxed))):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        # The optimizer state built from boxed params keeps the boxes (the trainer derives
        # its shardings from them) and unboxes to the plain state.
        boxed_state = jax.eval_shape(tx.init, _box(params))
        plain_state = jax.eval_shape(tx.init, params)
        assert jax.tree.structure(nn.meta.unbox(boxed_state)) == jax.tree.structure(plain_state)
        assert any(
            isinstance(x, nn.Partitioned)
            for x in jax.tree.leaves(boxed_state, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        )


def test_clipping_caps_the_global_norm():
    rng = np.random.default_rng(4)
    params = _tiny_tree(rng)
    # A huge gradient then a small one: clipping changes the Adam moments and so step 2.
    grads = [_grads(rng, params, scale=100.0), _grads(rng, params, scale=0.3)]
    base = dict(learning_rate=1e-2, warmup_steps=0, total_steps=10, weight_decay=0.01)
    s = optim.OptimizerSettings(max_grad_norm=1.0, **base)
    got = _run(optim.make_optimizer(s), params, grads)
    want = _np_reference(params, grads, s, clip=1.0)
    unclipped = _np_reference(params, grads, s)
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7, err_msg=k)
    assert not np.allclose(want["dense/kernel"], unclipped["dense/kernel"], rtol=1e-4)

    # None and 0 disable clipping.
    for off in (None, 0.0):
        s_off = optim.OptimizerSettings(max_grad_norm=off, **base)
        got_off = _run(optim.make_optimizer(s_off), params, grads)
        for k in params:
            np.testing.assert_allclose(got_off[k], unclipped[k], rtol=2e-5, atol=1e-7)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "field,value",
    [
        ("name", "sgd"),
        ("schedule", "exponential"),
        ("learning_rate", 0.0),
        ("learning_rate", float("nan")),
        ("warmup_steps", -1),
        ("warmup_steps", 2_000_000),
        ("warmup_steps", 1.5),
        ("total_steps", 0),
        ("end_learning_rate", -1e-5),
        ("end_learning_rate", 1.0),
        ("polynomial_power", 0.0),
        ("weight_decay", -0.1),
        ("b1", 1.0),
        ("b2", -0.5),
        ("eps", -1e-8),
        ("max_grad_norm", -1.0),
        ("decay_steps", -1),
        ("decay_steps", 2_000_000),
        ("decay_steps", 0.5),
        ("lr_decoupled_weight_decay", "yes"),
        ("frozen", "nsp_head"),
        ("frozen", ("",)),
    ],
)
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"OptimizerSettings\.{field}=") as info:
        optim.OptimizerSettings(**{field: value})
    assert repr(value) in str(info.value)


def test_valid_choices_are_listed_in_errors():
    with pytest.raises(ValueError, match="adamw"):
        optim.OptimizerSettings(name="adam")
    with pytest.raises(ValueError, match="polynomial"):
        optim.OptimizerSettings(schedule="poly")
    with pytest.raises(ValueError, match="stable_adamw"):
        optim.OptimizerSettings(name="stableadamw")
    with pytest.raises(ValueError, match=r"lr_decoupled_weight_decay=True.*not lamb"):
        optim.OptimizerSettings(name="lamb", lr_decoupled_weight_decay=True)
    with pytest.raises(ValueError, match=r"decay_steps=900.*\[0, total_steps - warmup_steps=800\]"):
        optim.OptimizerSettings(warmup_steps=200, total_steps=1000, decay_steps=900)
    optim.OptimizerSettings(warmup_steps=np.int64(5), total_steps=np.int64(10))


# --------------------------------------------------------------------------- the modern recipe


def test_wsd_schedule_boundaries():
    s = optim.OptimizerSettings(
        learning_rate=8e-4,
        warmup_steps=100,
        total_steps=1000,
        schedule="wsd",
        decay_steps=400,
        end_learning_rate=8e-6,
    )
    f = optim.make_schedule(s)
    assert _lr(f, 0) == 0.0
    assert _lr(f, 50) == pytest.approx(4e-4, rel=1e-6)
    assert _lr(f, 99) == pytest.approx(8e-4 * 0.99, rel=1e-6)
    assert _lr(f, 100) == pytest.approx(8e-4, rel=1e-6)  # end of warmup: the peak
    assert _lr(f, 350) == pytest.approx(8e-4, rel=1e-6)  # stable
    assert _lr(f, 600) == pytest.approx(8e-4, rel=1e-6)  # start of decay: still the peak
    # 1 - sqrt: a quarter of the way down the decay the rate has lost half its range.
    assert _lr(f, 700) == pytest.approx(8e-6 + (8e-4 - 8e-6) * 0.5, rel=1e-6)
    assert _lr(f, 601) == pytest.approx(8e-6 + (8e-4 - 8e-6) * (1 - math.sqrt(1 / 400)), rel=1e-6)
    assert _lr(f, 999) == pytest.approx(8e-6 + (8e-4 - 8e-6) * (1 - math.sqrt(399 / 400)), rel=1e-5)
    assert _lr(f, 1000) == pytest.approx(8e-6, rel=1e-6)  # the final value
    assert _lr(f, 5000) == pytest.approx(8e-6, rel=1e-6)

    # No decay: stays at the peak, past total_steps too; a continuation with a longer run
    # and a decay gives the same rates until its decay starts.
    stable = optim.make_schedule(dataclasses.replace(s, decay_steps=0))
    longer = optim.make_schedule(dataclasses.replace(s, total_steps=3000, decay_steps=1000))
    for step in (0, 50, 100, 999, 1000, 2000):
        assert _lr(stable, step) == _lr(longer, step)
    assert _lr(stable, 10**6) == pytest.approx(8e-4, rel=1e-6)
    assert _lr(longer, 2500) == pytest.approx(8e-6 + (8e-4 - 8e-6) * (1 - math.sqrt(0.5)))
    # The whole run after warmup decaying, under jit on int32 steps.
    whole = optim.make_schedule(dataclasses.replace(s, decay_steps=900))
    np.testing.assert_allclose(
        jax.jit(whole)(jnp.array([100, 325, 1000], jnp.int32)),
        [8e-4, 8e-6 + (8e-4 - 8e-6) * 0.5, 8e-6],
        rtol=1e-6,
    )


def _np_stable_adamw(params, grads_per_step, s, stacked_leaves=()):
    """StableAdamW as published (Wortsman et al.; optimi's loop, which ModernBERT uses):
    debiased betas b_hat = b (1 - b^(t-1)) / (1 - b^t), then per tensor
    rms = sqrt(mean(g^2 / max(v, eps^2))), lr_t = lr / max(1, rms),
    w <- w * (1 - lr_t * wd)  (or 1 - lr_t / lr_max * wd with decoupled weight decay),
    w <- w - lr_t * m / (sqrt(v) + eps). Returns the params and each step's rms values."""
    p = {k: np.asarray(x, np.float64) for k, x in params.items()}
    m = {k: np.zeros_like(x) for k, x in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    sched = optim.make_schedule(s)
    rms_per_step = []
    for t, grads in enumerate(grads_per_step, start=1):
        lr = float(sched(t - 1))
        b1_hat = s.b1 * (1 - s.b1 ** (t - 1)) / (1 - s.b1**t)
        b2_hat = s.b2 * (1 - s.b2 ** (t - 1)) / (1 - s.b2**t)
        rms_now = {}
        for k in p:
            g = np.asarray(grads[k], np.float64)
            m[k] = b1_hat * m[k] + (1 - b1_hat) * g
            v[k] = b2_hat * v[k] + (1 - b2_hat) * g * g
            layers = p[k].shape[0] if k in stacked_leaves else None
            ratio = g * g / np.maximum(v[k], s.eps**2)
            if layers:  # one rms per layer of a stacked leaf
                rms = np.sqrt(ratio.reshape(layers, -1).mean(1)).reshape(
                    (-1,) + (1,) * (g.ndim - 1)
                )
            else:
                rms = np.sqrt(ratio.mean())
            rms_now[k] = rms
            lr_t = lr / np.maximum(1.0, rms)
            if not ("bias" in k or "layer_norm" in k):
                scale = lr_t / s.learning_rate if s.lr_decoupled_weight_decay else lr_t
                p[k] = p[k] * (1 - scale * s.weight_decay)
            p[k] = p[k] - lr_t * m[k] / (np.sqrt(v[k]) + s.eps)
        rms_per_step.append(rms_now)
    return p, rms_per_step


@pytest.mark.parametrize("decoupled", [False, True])
def test_stable_adamw_matches_the_published_formula_with_update_clipping(decoupled):
    rng = np.random.default_rng(6)
    params = _tiny_tree(rng)
    # A calm step, a spike 30x larger (update clipping engages: g^2 far above v), a calm one.
    grads = [
        _grads(rng, params),
        _grads(rng, params, scale=30.0),
        _grads(rng, params, scale=0.5),
    ]
    s = optim.OptimizerSettings(
        name="stable_adamw",
        learning_rate=8e-3,
        warmup_steps=1,
        total_steps=10,
        schedule="wsd",
        decay_steps=0,
        b1=0.9,
        b2=0.98,
        eps=1e-6,
        weight_decay=0.1 if not decoupled else 1e-3,
        lr_decoupled_weight_decay=decoupled,
        max_grad_norm=None,
    )
    got = _run(optim.make_optimizer(s), {k: jnp.asarray(x) for k, x in params.items()}, grads)
    want, rms = _np_stable_adamw(params, grads, s)
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7, err_msg=k)
    # Step 1: v is g^2 itself, so no clipping (rms 1, the zero kernel's 0); step 2 clips
    # every tensor; plain AdamW would have taken a different step.
    assert all(np.all(np.asarray(r) <= 1.0 + 1e-9) for r in rms[0].values())
    assert all(np.all(np.asarray(r) > 1.2) for r in rms[1].values())
    adamw = optim.OptimizerSettings(**{**dataclasses.asdict(s), "name": "adamw"})
    unclipped = _run(optim.make_optimizer(adamw), params, grads)
    assert not np.allclose(unclipped["dense/kernel"], got["dense/kernel"], rtol=1e-4)


def test_stable_adamw_divides_per_layer_for_scanned_layers():
    rng = np.random.default_rng(7)
    params = _layered_tree(rng)
    calm = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    spike = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    spike["bert"]["encoder"]["layer_1"]["dense"]["kernel"] *= 40.0  # one layer spikes
    s = optim.OptimizerSettings(
        name="stable_adamw", learning_rate=1e-2, warmup_steps=0, total_steps=10, max_grad_norm=None
    )
    tx = optim.make_optimizer(s)
    unrolled = _run(tx, params, [calm, spike])
    scanned = _run(tx, _stack(params), [_stack(calm), _stack(spike)])
    for a, b in zip(jax.tree.leaves(_stack(unrolled)), jax.tree.leaves(scanned)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)

    flat = {
        jax.tree_util.keystr(k): x
        for k, x in jax.tree_util.tree_flatten_with_path(_stack(params))[0]
    }

    def flatten(tree):
        return {
            jax.tree_util.keystr(k): x
            for k, x in jax.tree_util.tree_flatten_with_path(_stack(tree))[0]
        }

    want, _ = _np_stable_adamw(
        flat,
        [flatten(calm), flatten(spike)],
        s,
        stacked_leaves={k for k in flat if "'layers'" in k},
    )
    for (_, got), key in zip(jax.tree_util.tree_flatten_with_path(scanned)[0], flat):
        np.testing.assert_allclose(got, want[key], rtol=2e-5, atol=1e-7, err_msg=key)
    # Boxed parameters (the trainer's state initialisation) give the same step.
    boxed = _run(tx, _box(params), [_box(calm), _box(spike)])
    for a, b in zip(jax.tree.leaves(unrolled), jax.tree.leaves(nn.meta.unbox(boxed))):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_lr_decoupled_weight_decay_for_adamw():
    # Decay of weight_decay * lr(step) / lr per step: with zero gradients only decay moves.
    params = {
        "dense/kernel": np.full((2, 2), 2.0, np.float32),
        "dense/bias": np.ones(2, np.float32),
    }
    zeros = {k: np.zeros_like(x) for k, x in params.items()}
    s = optim.OptimizerSettings(
        learning_rate=1e-3,
        warmup_steps=4,
        total_steps=10,
        schedule="constant",
        weight_decay=0.01,
        lr_decoupled_weight_decay=True,
        max_grad_norm=None,
    )
    got = _run(optim.make_optimizer(s), params, [zeros] * 3)
    # Steps 0, 1, 2 of a 4-step warmup: rate shares 0, 1/4, 1/2 of the peak.
    want = 2.0 * (1 - 0.0) * (1 - 0.01 / 4) * (1 - 0.01 / 2)
    np.testing.assert_allclose(got["dense/kernel"], want, rtol=1e-6)
    np.testing.assert_allclose(got["dense/bias"], 1.0)


def test_frozen_subtrees_never_move():
    rng = np.random.default_rng(8)
    params = {
        "bert": {"pooler": {"kernel": rng.normal(size=(3, 3)).astype(np.float32)}},
        "nsp_head": {"kernel": rng.normal(size=(3, 2)).astype(np.float32)},
        "nsp_headless": {"kernel": rng.normal(size=(3, 2)).astype(np.float32)},
    }
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    for name in optim.OPTIMIZERS:
        s = optim.OptimizerSettings(
            name=name,
            learning_rate=1e-2,
            warmup_steps=0,
            total_steps=10,
            frozen=("nsp_head", "bert/pooler"),
        )
        got = _run(optim.make_optimizer(s), _box(params), [_box(grads)] * 2)
        got = nn.meta.unbox(got)
        np.testing.assert_array_equal(got["nsp_head"]["kernel"], params["nsp_head"]["kernel"])
        np.testing.assert_array_equal(
            got["bert"]["pooler"]["kernel"], params["bert"]["pooler"]["kernel"]
        )
        assert not np.allclose(got["nsp_headless"]["kernel"], params["nsp_headless"]["kernel"])
