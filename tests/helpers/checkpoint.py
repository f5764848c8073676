"""A mesh of 8 devices, a small sharded train state and its saves, and the script a
one-device process runs to restore what eight saved: the checkpoint tests of every tier."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax.engine import checkpoint as ckpt


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "tests/conftest.py should give 8 simulated devices"
    return Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "fsdp"))


def make_params(mesh, seed=0):
    """A small BERT-like tree sharded over 8 devices, big enough to leave OCDBT data files."""
    rng = np.random.default_rng(seed)  # numpy: no compilation, the test stays fast
    params = {
        "embeddings": {"embedding": rng.standard_normal((256, 64), np.float32)},
        "layer_0": {
            "kernel": rng.standard_normal((64, 128), np.float32),
            "bias": np.arange(128, dtype=np.float32),
            "scale": rng.standard_normal(64).astype(jnp.bfloat16),
        },
    }
    sharded = NamedSharding(mesh, P("fsdp", None))
    sharded_1d = NamedSharding(mesh, P("fsdp"))
    replicated = NamedSharding(mesh, P())
    shardings = {
        "embeddings": {"embedding": sharded},
        "layer_0": {"kernel": sharded, "bias": replicated, "scale": sharded_1d},
    }
    return jax.device_put(params, shardings)


def make_state(mesh, seed=0):
    params = make_params(mesh, seed)
    # A real optax state: NamedTuples (ScaleByAdamState), EmptyState, an int32 count scalar.
    opt_state = optax.adamw(1e-3).init(params)
    return params, opt_state


def save_steps(directory, params, opt_state, steps, **kwargs):
    with ckpt.Checkpointer(directory, save_interval_steps=1, **kwargs) as checkpointer:
        for step in steps:
            assert checkpointer.save(step, params=params, opt_state=opt_state, meta={"step": step})


_ONE_DEVICE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np, optax
    from bertjax.engine import checkpoint as ckpt

    directory, expected_dir = sys.argv[1], sys.argv[2]
    assert jax.device_count() == 1, jax.devices()
    expected = dict(np.load(expected_dir + "/values.npz"))  # float32 copies
    dtypes = json.load(open(expected_dir + "/dtypes.json"))

    # Notebook path: no target given, everything lands on the single device.
    step, params, meta = ckpt.restore_params(directory)
    assert step == 4 and meta == {"step": 4}, (step, meta)
    flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
    assert sorted(flat) == sorted(expected), (sorted(flat), sorted(expected))
    for key, value in flat.items():
        assert str(value.dtype) == dtypes[key], (key, value.dtype)
        assert value.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
        np.testing.assert_array_equal(np.asarray(value, np.float32), expected[key])

    # Resume path: params and optimizer state onto a 1-device target.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    on_device = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    abs_params = jax.tree.map(on_device, params)
    abs_opt = jax.eval_shape(optax.adamw(1e-3).init, abs_params)
    abs_opt = jax.tree.map(on_device, abs_opt)
    with ckpt.Checkpointer(directory) as checkpointer:
        restored = checkpointer.restore(abstract_params=abs_params, abstract_opt_state=abs_opt)
    assert restored.step == 4
    assert int(restored.opt_state[0].count) == 3
    mu = np.asarray(restored.opt_state[0].mu["layer_0"]["kernel"])
    np.testing.assert_array_equal(mu, expected["['layer_0']['kernel']"] * 2)
    print("ONE_DEVICE_OK")
    """
)
