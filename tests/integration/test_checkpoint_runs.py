"""The integration tests of test_checkpoint.py (tests/unit/), with its helpers."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.checkpoint import (
    _ONE_DEVICE_SCRIPT,
    make_state,
    mesh,  # noqa: F401 (fixtures)
    save_steps,
)
from tests.helpers.xla_env import subprocess_env


@pytest.mark.slow
def test_saved_on_8_devices_restores_in_1_device_process(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    adam = opt_state[0]._replace(
        count=jnp.asarray(3, opt_state[0].count.dtype), mu=jax.tree.map(lambda x: x * 2, params)
    )
    opt_state = (adam,) + tuple(opt_state[1:])
    assert len(params["layer_0"]["kernel"].sharding.device_set) == 8
    save_steps(tmp_path / "ckpt", params, opt_state, [4])
    leaves = jax.tree_util.tree_leaves_with_path(params)
    np.savez(
        tmp_path / "values.npz",
        **{jax.tree_util.keystr(k): np.asarray(v.astype(jnp.float32)) for k, v in leaves},
    )
    (tmp_path / "dtypes.json").write_text(
        json.dumps({jax.tree_util.keystr(k): str(v.dtype) for k, v in leaves})
    )
    env = subprocess_env(1)
    result = subprocess.run(
        [sys.executable, "-c", _ONE_DEVICE_SCRIPT, str(tmp_path / "ckpt"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0 and "ONE_DEVICE_OK" in result.stdout, result.stderr[-3000:]
