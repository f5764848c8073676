"""Mesh building, logical rules, sharded init, and sharded == single-device on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.engine import steps
from bertjax.nn import sharding
from tests.helpers.params import count_params

# Heads (4) and intermediate (128) divide the tensor axis (4); hidden (64) divides fsdp.
# One layer: the sharding of every layer is the same, and compile time is what tests pay.
CFG = BertConfig(
    vocab_size=128,
    hidden_size=64,
    num_layers=1,
    num_heads=4,
    intermediate_size=128,
    max_position_embeddings=32,
    attention_impl="xla",
)
BATCH, SEQ = 8, 16
PREDICTIONS = 3
is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731


def _init_params(model):
    """The trainer's parameter initialiser for this test's shapes."""
    return model_lib.pretraining_init(model, SEQ, PREDICTIONS)


def _boxed_abstract(model):
    """Parameter shapes with their logical axis names, computing nothing."""
    return jax.eval_shape(_init_params(model), jax.random.key(0))


def _batch():
    rng = np.random.default_rng(0)
    lengths = rng.integers(6, SEQ + 1, BATCH)
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(5, CFG.vocab_size, (BATCH, SEQ)), 0).astype(np.int32)
    types = ((np.arange(SEQ)[None] >= 4) & (mask == 1)).astype(np.int32)
    positions = np.stack([rng.choice(n, 3, replace=False) for n in lengths]).astype(np.int32)
    return ids, types, mask, positions


def test_make_mesh_fills_and_rejects():
    assert jax.device_count() == 8
    mesh = sharding.make_mesh((2, -1, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 3
    assert dict(sharding.make_mesh((-1, 1, 1)).shape)["data"] == 8
    assert dict(sharding.make_mesh((1, 1, -1), jax.devices()[:4]).shape)["tensor"] == 4
    for shape, message in [
        ((3, 1, -1), "do not divide the 8 devices"),
        ((2, 2, 3), "has 12 devices but 8 are available"),
        ((2, 2), "3 integers"),
        ((2.0, 2, 2), "3 integers"),
        ((-1, -1, 2), "at most one -1"),
        ((0, 2, 4), "must be positive"),
    ]:
        with pytest.raises(ValueError, match=message):
            sharding.make_mesh(shape)


def test_batch_sharding_and_data_parallel_size():
    mesh = sharding.make_mesh((2, 2, 2))
    assert sharding.data_parallel_size(mesh) == 4
    assert sharding.batch_sharding(mesh).spec == P(("data", "fsdp"))
    x = jax.device_put(np.zeros((BATCH, SEQ)), sharding.batch_sharding(mesh))
    assert {s.data.shape for s in x.addressable_shards} == {(2, SEQ)}


@pytest.mark.parametrize("scan_layers", [False, True])
def test_every_parameter_has_a_logical_spec(scan_layers):
    config = BertConfig(**{**CFG.to_dict(), "scan_layers": scan_layers})
    abstract = _boxed_abstract(BertForPreTraining(config))
    ruled = {name for name, _ in sharding.LOGICAL_RULES}
    leaves = jax.tree_util.tree_leaves_with_path(abstract, is_leaf=is_box)
    assert len(leaves) > 20
    for path, leaf in leaves:
        where = jax.tree_util.keystr(path)
        assert is_box(leaf), f"{where} has no partitioning annotation"
        assert len(leaf.names) == leaf.value.ndim, where
        assert set(leaf.names) <= ruled, f"{where} uses names outside the rules: {leaf.names}"
        if scan_layers and "encoder" in where:
            assert leaf.names[0] == sharding.LAYERS, where


def test_init_sharded_splits_kernels_across_devices():
    model = BertForPreTraining(CFG)
    mesh = sharding.make_mesh((2, 1, 4))
    factory = steps.make_state(_init_params(model), None, mesh)
    params, shardings = factory.init(jax.random.key(0)).params, factory.shardings.params
    assert jax.tree.structure(params) == jax.tree.structure(shardings)
    layer = params["bert"]["encoder"]["layer_0"]
    query = layer["attention"]["query"]["kernel"]  # [H, N, D] = [64, 4, 16]
    assert query.sharding.spec == P("fsdp", "tensor", None)
    assert {s.data.shape for s in query.addressable_shards} == {(64, 1, 16)}
    shard_shapes = lambda x: {s.data.shape for s in x.addressable_shards}  # noqa: E731
    assert shard_shapes(layer["mlp"]["intermediate"]["kernel"]) == {(64, 32)}
    assert shard_shapes(layer["mlp"]["output"]["kernel"]) == {(32, 64)}
    # Different devices hold different slices (not copies).
    shards = [np.asarray(s.data) for s in query.addressable_shards if s.index[0] == slice(None)]
    assert not np.array_equal(shards[0], shards[1])

    # On an fsdp mesh, look at the compiled program: each device only writes its shards, a
    # fraction of the model.
    mesh = sharding.make_mesh((1, 2, 4))
    abstract = _boxed_abstract(model)
    factory = steps.make_state(_init_params(model), None, mesh)
    with jax.set_mesh(mesh):
        compiled = factory.init.lower(jax.random.key(0)).compile()
    assert compiled.memory_analysis().output_size_in_bytes < 0.5 * 4 * count_params(abstract)
    params = compiled(jax.random.key(0)).params
    query = params["bert"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
    assert {s.data.shape for s in query.addressable_shards} == {(32, 1, 16)}
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert {s.data.shape for s in table.addressable_shards} == {(128, 32)}
    # Both FFN kernels are split over fsdp (embed side) and tensor (intermediate side).
    mlp = params["bert"]["encoder"]["layer_0"]["mlp"]
    assert mlp["intermediate"]["kernel"].sharding.spec == P("fsdp", "tensor")  # [64, 128]
    assert mlp["output"]["kernel"].sharding.spec == P("tensor", "fsdp")  # [128, 64]
    assert {s.data.shape for s in mlp["output"]["kernel"].addressable_shards} == {(32, 32)}


def _outputs_and_grads(params, ids, types, mask, positions):
    def loss(p):
        out = BertForPreTraining(CFG).apply({"params": p}, ids, types, mask, positions)
        value = jnp.mean(jax.nn.log_softmax(out.mlm_logits)[..., 5]) + jnp.mean(out.nsp_logits**2)
        return value, out

    return jax.value_and_grad(loss, has_aux=True)(params)


def test_sharded_forward_and_grads_equal_single_device():
    batch = _batch()
    boxed = _boxed_abstract(BertForPreTraining(CFG))
    # Random values everywhere (LayerNorm included) make every parameter matter.
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda x: jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype), nn.meta.unbox(boxed)
    )
    (ref_loss, ref_out), ref_grads = jax.jit(_outputs_and_grads)(params, *batch)

    for shape in [(8, 1, 1), (2, 2, 2), (1, 2, 4)]:
        mesh = sharding.make_mesh(shape)
        param_shardings = sharding.logical_shardings(boxed, mesh)
        sharded_params = jax.device_put(params, param_shardings)
        sharded_batch = jax.device_put(batch, sharding.batch_sharding(mesh))
        step = jax.jit(_outputs_and_grads, out_shardings=(None, param_shardings))
        with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_RULES):
            (loss, out), grads = step(sharded_params, *sharded_batch)
            if shape == (2, 2, 2):  # layer boundaries carry logical sharding constraints
                jaxpr = str(jax.make_jaxpr(_outputs_and_grads)(sharded_params, *sharded_batch))
                assert "sharding_constraint" in jaxpr
        rows = {s.data.shape[0] for s in out.sequence_output.addressable_shards}
        assert rows == {BATCH // sharding.data_parallel_size(mesh)}, shape  # batch stays split
        np.testing.assert_allclose(loss, ref_loss, atol=1e-5, err_msg=str(shape))
        for name, a, b in zip(out._fields, out, ref_out):
            assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5, (shape, name)
        diffs = jax.tree.map(
            lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), grads, ref_grads
        )
        assert max(jax.tree.leaves(diffs)) <= 1e-5, (shape, diffs)


def test_logical_shardings_cover_optimizer_state():
    mesh = sharding.make_mesh((1, 2, 4))
    abstract = _boxed_abstract(BertForPreTraining(CFG))
    opt_state = jax.eval_shape(optax.adamw(1e-3).init, abstract)
    shardings = sharding.logical_shardings(opt_state, mesh)
    mu = shardings[0].mu["bert"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
    assert mu.spec == P("fsdp", "tensor")
    assert shardings[0].count.spec == P()  # unannotated leaves are replicated
