"""Checkpoint save/restore with Orbax: sharded arrays, optax state, fallback, params-only."""

import errno
import gc
import glob
import logging
import os
import shutil
import sys
import threading
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from etils import epath
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax.engine import checkpoint as ckpt
from bertjax.engine import integrity
from tests.helpers.checkpoint import (
    make_state,
    mesh,  # noqa: F401 (fixtures)
    save_steps,
)

# The checkpoint tests save as Orbax does by default (conftest.py's whole_shard_saves says
# what the rest of the suite does instead).
pytestmark = pytest.mark.usefixtures("orbax_defaults")


def abstract(tree, sharding=None):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or x.sharding), tree
    )


def assert_trees_equal(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.dtype == e.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def test_round_trip_sharded_with_optax_state_and_meta(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    # Make the optimizer state non-trivial so a wrong restore would be visible.
    opt_state = jax.tree.map(
        lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.inexact) else x + 3, opt_state
    )
    meta = {"loader": {"epoch": 2, "position": 17}, "rng": [0, 42], "config": {"hidden_size": 64}}
    with ckpt.Checkpointer(tmp_path, save_interval_steps=10) as checkpointer:
        assert checkpointer.latest_step() is None
        assert (
            checkpointer.restore(
                abstract_params=abstract(params), abstract_opt_state=abstract(opt_state)
            )
            is None
        )
        # The trainer donates its state to the next step right after save returns: the save
        # must already hold its own host copy, so freeing the device buffers is harmless.
        params_copy, opt_copy = jax.tree.map(jnp.copy, (params, opt_state))
        assert checkpointer.save(10, params=params_copy, opt_state=opt_copy, meta=meta)
        for leaf in jax.tree.leaves((params_copy, opt_copy)):
            leaf.delete()
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(
            abstract_params=abstract(params), abstract_opt_state=abstract(opt_state)
        )
    assert restored.step == 10
    assert restored.meta == meta
    assert_trees_equal(restored.params, params)
    assert_trees_equal(restored.opt_state, opt_state)
    assert isinstance(restored.opt_state[0], optax.ScaleByAdamState)
    assert restored.opt_state[0].count.dtype == jnp.int32
    embedding = params["embeddings"]["embedding"]
    assert restored.params["embeddings"]["embedding"].sharding == embedding.sharding
    # The layout promised by the module docstring.
    assert set(ckpt.ITEM_NAMES) <= set(os.listdir(tmp_path / "10"))
    assert os.path.exists(tmp_path / "10" / ckpt.META_ITEM / "metadata")


def test_interval_force_keep_and_no_overwrite(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    assert ckpt.newest_step(tmp_path) is None and ckpt.newest_step(tmp_path / "none") is None
    with ckpt.Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=3) as checkpointer:
        started = [
            checkpointer.save(s, params=params, opt_state=opt_state, meta={}) for s in range(1, 11)
        ]
        assert started == [s % 3 == 0 for s in range(1, 11)]
        # The end-of-training save is forced; an already saved step is never rewritten.
        assert not checkpointer.save(9, params=params, opt_state=opt_state, meta={}, force=True)
        assert checkpointer.save(10, params=params, opt_state=opt_state, meta={}, force=True)
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [9, 10]
        assert checkpointer.latest_step() == 10
        assert checkpointer.reached_preemption(10) is False
    assert sorted(os.listdir(tmp_path)) == ["10", "9"]
    assert ckpt.newest_step(tmp_path) == 10


def test_preemption_forces_a_save_between_intervals(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    with ckpt.Checkpointer(tmp_path, save_interval_steps=100) as checkpointer:
        checkpointer._manager.reached_preemption = lambda step: step == 7
        assert checkpointer.reached_preemption(7) is True
        assert not checkpointer.save(6, params=params, opt_state=opt_state, meta={})
        assert checkpointer.save(7, params=params, opt_state=opt_state, meta={})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [7]


def test_non_finite_params_never_overwrite_good_checkpoint(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        assert checkpointer.save(1, params=params, opt_state=opt_state, meta={})
        bad = jax.tree.map(lambda x: x, params)
        bad["layer_0"]["kernel"] = bad["layer_0"]["kernel"].at[3, 5].set(jnp.nan)
        with pytest.raises(ValueError, match=r"step 2.*\['layer_0'\]\['kernel'\]"):
            checkpointer.save(2, params=bad, opt_state=opt_state, meta={})
        bad["layer_0"]["kernel"] = params["layer_0"]["kernel"]
        bad["layer_0"]["scale"] = bad["layer_0"]["scale"].at[0].set(jnp.inf)
        with pytest.raises(ValueError, match=r"step 3.*\['layer_0'\]\['scale'\]"):
            checkpointer.save(3, params=bad, opt_state=opt_state, meta={}, force=True)
        # The optimizer state too, since a restore would refuse it; the message says what is kept.
        nan_mu = opt_state[0].mu["layer_0"]["bias"].at[1].set(jnp.nan)
        bad_adam = opt_state[0]._replace(
            mu={**opt_state[0].mu, "layer_0": {**opt_state[0].mu["layer_0"], "bias": nan_mu}}
        )
        with pytest.raises(
            ValueError,
            match=r"step 4: .* in opt_state\[0\]\.mu\['layer_0'\]\['bias'\]; step 1 is the "
            r"newest complete checkpoint",
        ):
            checkpointer.save(
                4, params=params, opt_state=(bad_adam,) + tuple(opt_state[1:]), meta={}
            )
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [1]


def test_bad_arguments_are_named(tmp_path, mesh):
    with pytest.raises(ValueError, match="max_to_keep=0"):
        ckpt.Checkpointer(tmp_path, max_to_keep=0)
    with pytest.raises(ValueError, match="save_interval_steps=-5"):
        ckpt.Checkpointer(tmp_path, save_interval_steps=-5)
    params, opt_state = make_state(mesh)
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        with pytest.raises(ValueError, match="not JSON-serialisable"):
            checkpointer.save(1, params=params, opt_state=opt_state, meta={"x": object()})
        with pytest.raises(ValueError, match="step=-1"):
            checkpointer.save(-1, params=params, opt_state=opt_state, meta={})
        assert checkpointer.save(2, params=params, opt_state=opt_state, meta={})
        with pytest.raises(ValueError, match=r"step=5 is not a checkpoint.*\[2\]"):
            checkpointer.restore(
                abstract_params=abstract(params), abstract_opt_state=abstract(opt_state), step=5
            )
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ckpt.restore_params(tmp_path / "missing")


def _truncate_params_data(step_dir):
    files = glob.glob(str(step_dir / ckpt.PARAMS_ITEM / "ocdbt.process_*" / "d" / "*"))
    assert files, "expected OCDBT data files"
    for name in files:
        with open(name, "r+b") as f:
            f.truncate(8)


def _delete_params_data(step_dir):
    files = glob.glob(str(step_dir / ckpt.PARAMS_ITEM / "ocdbt.process_*" / "d" / "*"))
    assert files, "expected OCDBT data files"
    for name in files:
        os.remove(name)


@pytest.mark.parametrize("damage", [_truncate_params_data, _delete_params_data])
# A failed read leaves Orbax's sibling reads running (timing dependent); their late reports
# ("Exception ignored ...") must be contained, so any that reaches pytest fails the test.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_latest_falls_back_with_warning(tmp_path, mesh, caplog, damage):
    params1, opt1 = make_state(mesh, seed=1)
    params2, opt2 = make_state(mesh, seed=2)
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, params=params1, opt_state=opt1, meta={"step": 1})
        checkpointer.save(2, params=params2, opt_state=opt2, meta={"step": 2})
    damage(tmp_path / "2")

    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
            restored = checkpointer.restore(
                abstract_params=abstract(params1), abstract_opt_state=abstract(opt1)
            )
        assert restored.step == 1 and restored.meta == {"step": 1}
        assert_trees_equal(restored.params, params1)
        messages = [r.getMessage() for r in caplog.records]
        assert any("step 2" in m and "cannot be restored" in m for m in messages), messages
        # The bad step is moved aside, so the resumed run can write step 2 again.
        assert checkpointer.all_steps() == [1]
        assert len(os.listdir(tmp_path / ckpt.CORRUPT_SUBDIR)) == 1
        assert checkpointer.save(2, params=params2, opt_state=opt2, meta={"step": 2})
    assert ckpt.read_meta(tmp_path) == {"step": 2}
    gc.collect()


def test_killed_mid_write_tmp_directory_is_ignored(tmp_path, mesh):
    params1, opt1 = make_state(mesh, seed=1)
    save_steps(tmp_path, params1, opt1, [1, 2])
    # What a save killed mid-write leaves: a tmp directory, no commit marker, missing data.
    partial = tmp_path / "3.orbax-checkpoint-tmp-1712345678"
    shutil.copytree(tmp_path / "2", partial)
    os.remove(partial / "commit_success.txt")
    shutil.rmtree(partial / ckpt.META_ITEM)
    _truncate_params_data(partial)

    step, params, meta = ckpt.restore_params(tmp_path)
    assert (step, meta) == (2, {"step": 2})
    assert_trees_equal(params, jax.device_get(params1))
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        restored = checkpointer.restore(
            abstract_params=abstract(params1), abstract_opt_state=abstract(opt1)
        )
        assert restored.step == 2
        assert checkpointer.save(3, params=params1, opt_state=opt1, meta={"step": 3})
    assert ckpt.read_meta(tmp_path) == {"step": 3}
    assert not partial.exists()  # cleaned up by the next writer


# A failed read leaves Orbax's sibling reads running (timing dependent); their late reports
# ("Exception ignored ...") must be contained, so any that reaches pytest fails the test.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_no_restorable_step_raises_instead_of_starting_over(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    save_steps(tmp_path, params, opt_state, [1, 2])
    for step in ("1", "2"):
        _delete_params_data(tmp_path / step)
    with ckpt.Checkpointer(tmp_path) as checkpointer:
        with pytest.raises(
            ckpt.CheckpointRestoreError, match=r"none could be restored.*step 2.*step 1"
        ):
            checkpointer.restore(
                abstract_params=abstract(params), abstract_opt_state=abstract(opt_state)
            )
        assert checkpointer.all_steps() == [1, 2]  # nothing moved when nothing restored
    with pytest.raises(ckpt.CheckpointRestoreError):
        ckpt.restore_params(tmp_path)
    gc.collect()


def test_restore_params_reads_no_optimizer_state(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    save_steps(tmp_path, params, opt_state, [5])
    shutil.rmtree(tmp_path / "5" / ckpt.OPT_STATE_ITEM)
    step, restored, meta = ckpt.restore_params(tmp_path)
    assert (step, meta) == (5, {"step": 5})
    assert_trees_equal(restored, jax.device_get(params))
    for leaf in jax.tree.leaves(restored):
        assert leaf.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
    # With an explicit target on another mesh layout.
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "fsdp"))
    # Shard the last axis this time (it was the first when saved).
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(other, P(*[None] * (x.ndim - 1), "fsdp"))
        ),
        params,
    )
    _, resharded, _ = ckpt.restore_params(tmp_path, step=5, abstract_params=target)
    assert_trees_equal(resharded, jax.device_get(params))
    assert resharded["layer_0"]["kernel"].sharding == NamedSharding(other, P(None, "fsdp"))


def test_close_leaves_no_running_threads(tmp_path, mesh):
    params, opt_state = make_state(mesh)
    before = {t.ident for t in threading.enumerate()}
    checkpointer = ckpt.Checkpointer(tmp_path, save_interval_steps=1)
    assert checkpointer.save(1, params=params, opt_state=opt_state, meta={})
    checkpointer.close()
    checkpointer.close()  # idempotent
    assert sorted(os.listdir(tmp_path)) == ["1"]  # finished: no tmp directory left
    started = [t for t in threading.enumerate() if t.ident not in before and not t.daemon]
    # Orbax runs its file work through asyncio's default executor and closes that event loop
    # with shutdown(wait=False): its worker threads have been told to exit but may still be
    # finishing. A thread that is still alive after a generous join is one that keeps running.
    for thread in started:
        thread.join(timeout=10)
    leftover = [t for t in started if t.is_alive()]
    assert not leftover, leftover
    with pytest.raises(RuntimeError, match="closed"):
        checkpointer.save(2, params=params, opt_state=opt_state, meta={})


# ----------------------------------------------------------------------------- integrity


def _random_finite_bits(rng, shape, dtype):
    """Finite floats with uniformly random bits: incompressible, so stored verbatim on disk."""
    unsigned, exponent_mask = {2: (np.uint16, 0x7F80), 4: (np.uint32, 0x7F800000)}[
        np.dtype(dtype).itemsize
    ]
    bits = rng.integers(0, np.iinfo(unsigned).max, size=shape, dtype=unsigned, endpoint=True)
    all_ones = (bits & exponent_mask) == exponent_mask  # inf or NaN: lower the exponent by one
    bits[all_ones] ^= exponent_mask & -exponent_mask
    return bits.view(dtype)


def make_trained_state(mesh, seed):
    """A state as it looks mid-training, every float leaf (Adam moments too) holding values."""
    params, opt_state = make_state(mesh, seed)
    rng = np.random.default_rng(seed + 100)

    def fill(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return jax.device_put(_random_finite_bits(rng, x.shape, x.dtype), x.sharding)

    params = jax.tree.map(fill, params)
    adam = opt_state[0]._replace(
        count=jnp.asarray(7, opt_state[0].count.dtype),
        mu=jax.tree.map(fill, params),
        nu=jax.tree.map(fill, params),
    )
    return params, (adam,) + tuple(opt_state[1:])


def _data_files(step_dir, item):
    files = glob.glob(str(step_dir / item / "ocdbt.process_*" / "d" / "*"))
    assert files, "expected OCDBT data files"
    return files


def _overwrite_values(step_dir, item, stored):
    """Overwrite 256 bytes of the stored array's values on disk with other finite values.

    The values are incompressible, so their bytes are in the item's data files verbatim: the
    damage lands inside the array's data and reads back without any error, just different.
    """
    old = np.ascontiguousarray(np.asarray(stored)[8:9]).tobytes()[:256]
    new = _random_finite_bits(
        np.random.default_rng(9), (256 // stored.dtype.itemsize,), stored.dtype
    )
    assert len(old) == 256 and new.tobytes() != old
    for name in _data_files(step_dir, item):
        with open(name, "r+b") as f:
            offset = f.read().find(old)
            if offset >= 0:
                f.seek(offset)
                f.write(new.tobytes())
                return
    raise AssertionError(f"the bytes of the array were not found in {step_dir / item}")


def _garble_middle(step_dir, item):
    """Overwrite 256 random bytes in the middle of the item's largest data file."""
    largest = max(_data_files(step_dir, item), key=os.path.getsize)
    assert os.path.getsize(largest) > 4096, "expected a data file holding array values"
    with open(largest, "r+b") as f:
        f.seek(os.path.getsize(largest) // 2)
        f.write(np.random.default_rng(7).integers(0, 256, 256, dtype=np.uint8).tobytes())


# Where the damage lands: the values of one known leaf (they read back without error, so only
# the fingerprint notices), or anywhere (then a read error or NaN may notice first).
@pytest.mark.parametrize(
    "item,damage",
    [
        (ckpt.PARAMS_ITEM, "values"),
        (ckpt.OPT_STATE_ITEM, "values"),
        (ckpt.PARAMS_ITEM, "middle"),
        (ckpt.OPT_STATE_ITEM, "middle"),
    ],
)
# Damage found by a failed read leaves Orbax's sibling reads running (see above).
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_garbled_bytes_fall_back_on_every_restore_path(tmp_path, mesh, caplog, item, damage):
    state1, state2 = make_trained_state(mesh, seed=1), make_trained_state(mesh, seed=2)
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        checkpointer.save(1, params=state1[0], opt_state=state1[1], meta={"step": 1})
        checkpointer.save(2, params=state2[0], opt_state=state2[1], meta={"step": 2})
    kernel = state2[0]["layer_0"]["kernel"]
    leaf, leaf_name = {
        ckpt.PARAMS_ITEM: (kernel, "params['layer_0']['kernel']"),
        ckpt.OPT_STATE_ITEM: (
            state2[1][0].nu["layer_0"]["kernel"],
            "opt_state[0].nu['layer_0']['kernel']",
        ),
    }[item]
    if damage == "values":
        _overwrite_values(tmp_path / "2", item, leaf)
    else:
        _garble_middle(tmp_path / "2", item)
    params_damaged = item == ckpt.PARAMS_ITEM
    host_params = {1: jax.device_get(state1[0]), 2: jax.device_get(state2[0])}

    # Params only (bertjax.load, init_from): reads no optimizer state, so only a damaged
    # params item makes it fall back. Checked on one device and on another mesh layout.
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "fsdp"))
    on_other_mesh = abstract(state1[0], NamedSharding(other, P("data")))
    for target in (None, on_other_mesh):
        step, params, meta = ckpt.restore_params(tmp_path, abstract_params=target)
        expected = 1 if params_damaged else 2
        assert (step, meta) == (expected, {"step": expected})
        assert_trees_equal(jax.device_get(params), host_params[expected])
    assert os.path.isdir(tmp_path / "2")  # readers move nothing
    if params_damaged:
        with pytest.raises(ckpt.CheckpointRestoreError, match=r"step 2"):
            ckpt.restore_params(tmp_path, step=2)

    # Resuming: the damaged step is named, moved aside, and the previous one restored.
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
            restored = checkpointer.restore(
                abstract_params=abstract(state1[0]), abstract_opt_state=abstract(state1[1])
            )
        assert restored.step == 1 and restored.meta == {"step": 1}
        assert_trees_equal(restored.params, state1[0])
        assert_trees_equal(restored.opt_state, state1[1])
        messages = [r.getMessage() for r in caplog.records]
        assert any("step 2" in m and "cannot be restored" in m for m in messages), messages
        if damage == "values":
            assert any(
                f"step 2 is damaged: {leaf_name}" in m and "fingerprint mismatch" in m
                for m in messages
            ), messages
        assert checkpointer.all_steps() == [1]
        assert [name.split("-")[0] for name in os.listdir(tmp_path / ckpt.CORRUPT_SUBDIR)] == ["2"]
    gc.collect()


def _save_unchecked(directory, step, params, opt_state, meta):
    """Write a step the way checkpoints were written before integrity records existed."""
    manager = ocp.CheckpointManager(
        epath.Path(directory), item_names=ckpt.ITEM_NAMES, item_handlers=ckpt._item_handlers()
    )
    manager.save(
        step,
        args=ocp.args.Composite(
            **{
                ckpt.PARAMS_ITEM: ocp.args.StandardSave(params),
                ckpt.OPT_STATE_ITEM: ocp.args.StandardSave(opt_state),
                ckpt.META_ITEM: ocp.args.JsonSave(meta),
            }
        ),
    )
    manager.close()


def test_old_checkpoints_restore_with_finiteness_checked(tmp_path, mesh, caplog):
    params1, opt1 = make_trained_state(mesh, seed=1)
    params2, opt2 = make_trained_state(mesh, seed=2)
    _save_unchecked(tmp_path, 1, params1, opt1, {"step": 1})
    # A NaN in the optimizer state: saving refuses that now, older versions did not.
    adam = opt2[0]._replace(
        mu={
            **opt2[0].mu,
            "embeddings": {
                "embedding": jnp.full_like(opt2[0].mu["embeddings"]["embedding"], jnp.nan)
            },
        }
    )
    _save_unchecked(tmp_path, 2, params2, (adam,) + tuple(opt2[1:]), {"step": 2})
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
            restored = checkpointer.restore(
                abstract_params=abstract(params1), abstract_opt_state=abstract(opt1)
            )
    assert restored.step == 1 and restored.meta == {"step": 1}
    assert_trees_equal(restored.opt_state, opt1)
    assert any(
        "step 2" in m and "opt_state[0].mu['embeddings']['embedding'] holds NaN or inf" in m
        for m in [r.getMessage() for r in caplog.records]
    )
    # Old params-only reads still work (step 2 was moved aside above).
    step, params, meta = ckpt.restore_params(tmp_path)
    assert (step, meta) == (1, {"step": 1})
    assert_trees_equal(params, jax.device_get(params1))


def test_fingerprints_cover_values_positions_and_dtypes(mesh):
    params, opt_state = make_trained_state(mesh, seed=3)
    summaries = integrity.summarise({"params": params, "opt_state": opt_state})
    names = [s.name for s in summaries]
    assert "params['layer_0']['scale']" in names and "opt_state[0].count" in names
    by_name = {s.name: s for s in summaries}
    assert by_name["params['layer_0']['scale']"].dtype == "bfloat16"

    def fingerprint(x):
        return integrity.summarise({"x": x})[0].fingerprint

    kernel = params["layer_0"]["kernel"]
    host = np.asarray(kernel)
    # The same values on one device, on another mesh, and as numpy: the same fingerprint.
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "fsdp"))
    assert fingerprint(kernel) == by_name["params['layer_0']['kernel']"].fingerprint
    assert fingerprint(jax.device_put(host, NamedSharding(other, P(None, "fsdp")))) == (
        fingerprint(kernel)
    )
    assert fingerprint(jax.device_put(host, jax.devices()[3])) == fingerprint(kernel)
    # One flipped low bit, two swapped elements, a transposed copy: all different.
    flipped = host.copy()
    flipped.view(np.uint32)[5, 7] ^= 1
    swapped = host.copy()
    swapped[0, 0], swapped[0, 1] = host[0, 1], host[0, 0]
    square = host[:64, :64]
    for changed in (flipped, swapped):
        assert fingerprint(changed) != fingerprint(host)
    assert fingerprint(np.ascontiguousarray(square.T)) != fingerprint(square)
    # 8-, 64-bit and boolean leaves are covered too.
    assert fingerprint(np.arange(10, dtype=np.uint8)) != fingerprint(
        np.arange(1, 11, dtype=np.uint8)
    )
    assert fingerprint(np.array([True, False])) != fingerprint(np.array([False, True]))
    with jax.enable_x64(True):
        wide = np.arange(10, dtype=np.float64)
        high_bit_changed = wide.copy()
        high_bit_changed.view(np.uint64)[3] ^= 1 << 40  # in the upper 32-bit word
        assert fingerprint(high_bit_changed) != fingerprint(wide)


@pytest.mark.parametrize(
    "dtype", ["float32", "bfloat16", "float16", "int32", "uint8", "int8", "bool"]
)
def test_small_leaves_summarised_on_the_host_match_the_devices_bit_for_bit(dtype):
    """Leaves up to HOST_ELEMENTS are summarised by numpy instead of a compiled program: the
    same fingerprints and finiteness as the devices' function, so checkpoints of either
    version verify under the other. Sizes around the threshold, a leaf sharded over 8
    devices, empty leaves and leaves holding inf or NaN."""
    rng = np.random.default_rng(0)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    largest = integrity.HOST_ELEMENTS
    for shape in [(), (0,), (1,), (7, 5), (3, 4, 8), (largest // 8, 8), (largest + 8,)]:
        if dtype == "bool":
            x = rng.random(shape) < 0.5
        elif np.issubdtype(np.dtype(jnp.dtype(dtype)), np.integer):
            x = rng.integers(-128 if dtype != "uint8" else 0, 128, shape).astype(dtype)
        else:
            x = (rng.standard_normal(shape) * 100).astype(jnp.dtype(dtype))
        x = np.asarray(x)  # a 0-d draw comes back as a numpy scalar
        leaves = [x]
        if x.ndim and x.shape[0] % 8 == 0 and x.size:
            leaves.append(jax.device_put(x, NamedSharding(mesh, P("data"))))
        if x.size and dtype.startswith(("float", "bfloat")):
            for bad in (np.inf, np.nan):
                damaged = x.copy()
                damaged.reshape(-1)[x.size // 2] = bad
                leaves.append(damaged)
        for leaf in leaves:
            on_devices = np.asarray(integrity._leaf_summary_jit(leaf))
            (summary,) = integrity.summarise({"x": leaf})
            assert integrity._on_host(leaf) == (leaf.size <= largest)
            where = f"{dtype} {shape} {type(leaf).__name__}"
            assert (summary.fingerprint, summary.finite) == tuple(map(int, on_devices)), where


# ----------------------------------------------------------------------------- failed saves


def _fill_disk_at(monkeypatch, directory, step):
    """From now on, writing a file of `step` fails the way a full disk fails."""
    path_class = type(epath.Path(os.fspath(directory)))
    write_text = path_class.write_text

    def full_disk_write_text(self, *args, **kwargs):
        relative = os.path.relpath(os.fspath(self), os.fspath(directory))
        if relative.split(os.sep)[0].split(".")[0] == str(step):  # "2" or "2.orbax-checkpoint-tmp"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(path_class, "write_text", full_disk_write_text)


def _poll_until_save_fails(checkpointer):
    for _ in range(6000):  # the write fails within milliseconds; 60 s before giving up
        checkpointer.check_for_errors()
        time.sleep(0.01)


def _ends_when_its_work_is_done(thread: threading.Thread) -> bool:
    """Orbax's one-shot threads end after their write, and so do the workers of an executor
    that has been shut down. A worker of an executor still open (the default executor of an
    event loop that lives on, as one does in this process once a GCS test has run here) waits
    for work until the interpreter exits: joining it would only wait out the timeout."""
    args = getattr(thread, "_args", ())  # concurrent.futures' _worker(executor_reference, ...)
    executor = args[0]() if args and isinstance(args[0], weakref.ref) else None
    return executor is None or executor._shutdown


@pytest.mark.parametrize("noticed_by", ["check_for_errors", "next_save", "close", "sync_save"])
# A synchronous save that fails leaves Orbax's array writes never started; Python warns once
# when they are collected (the training loop saves asynchronously, where this does not occur).
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_full_disk_is_one_error_at_the_save_that_failed(
    tmp_path, mesh, caplog, monkeypatch, noticed_by
):
    params1, opt1 = make_state(mesh, seed=1)
    params2, opt2 = make_state(mesh, seed=2)
    threads_before = set(threading.enumerate())
    checkpointer = ckpt.Checkpointer(
        tmp_path, save_interval_steps=1, async_save=noticed_by != "sync_save"
    )
    assert checkpointer.save(1, params=params1, opt_state=opt1, meta={"step": 1})
    checkpointer.wait_until_finished()
    _fill_disk_at(monkeypatch, tmp_path, 2)
    caplog.set_level(logging.WARNING)
    if noticed_by == "sync_save":
        with pytest.raises(ckpt.CheckpointSaveError) as failure:
            checkpointer.save(2, params=params2, opt_state=opt2, meta={"step": 2})
    else:
        # Returns once the arrays are copied; the write then fails in the background.
        assert checkpointer.save(2, params=params2, opt_state=opt2, meta={"step": 2})
        with pytest.raises(ckpt.CheckpointSaveError) as failure:
            if noticed_by == "check_for_errors":  # what the training loop calls every step
                _poll_until_save_fails(checkpointer)
            elif noticed_by == "next_save":
                checkpointer.save(3, params=params2, opt_state=opt2, meta={"step": 3})
            else:
                checkpointer.close()
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith(f"could not write checkpoint step 2 to {tmp_path}: the disk is full")
    assert "step 1 is the newest complete checkpoint" in message
    assert (failure.value.step, failure.value.last_complete_step) == (2, 1)
    assert isinstance(failure.value.__cause__, OSError)
    # Orbax's own per-thread tracebacks of the failure are not printed.
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    checkpointer.close()  # reported once: closing does not raise it again
    monkeypatch.undo()
    # The failed save's other writes run on for a moment in Orbax's threads. A training run
    # exits after the error, so its next start never meets them; this test goes on in the same
    # process and must not race them when it reopens the directory below.
    for thread in set(threading.enumerate()) - threads_before:
        if not thread.daemon and _ends_when_its_work_is_done(thread):
            try:
                thread.join(timeout=60)
            except OSError:  # Orbax's threads raise their error again from join()
                pass

    step, params, meta = ckpt.restore_params(tmp_path)
    assert (step, meta) == (1, {"step": 1})
    assert_trees_equal(params, jax.device_get(params1))
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1) as checkpointer:
        restored = checkpointer.restore(
            abstract_params=abstract(params1), abstract_opt_state=abstract(opt1)
        )
        assert restored.step == 1
        assert checkpointer.save(2, params=params2, opt_state=opt2, meta={"step": 2})
    assert ckpt.read_meta(tmp_path) == {"step": 2}
    # Collect the writes the failure abandoned while this test's warning filters are in place.
    gc.collect()


def test_failure_without_a_complete_step_says_so(tmp_path, mesh, monkeypatch):
    params, opt_state = make_state(mesh)
    _fill_disk_at(monkeypatch, tmp_path, 5)
    with ckpt.Checkpointer(tmp_path, save_interval_steps=1, async_save=False) as checkpointer:
        with pytest.raises(ckpt.CheckpointSaveError, match=r"step 5 .*no complete checkpoint"):
            checkpointer.save(5, params=params, opt_state=opt_state, meta={})


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_fallback_past_unreadable_steps_prints_no_ignored_exceptions(tmp_path, mesh, monkeypatch):
    # Many arrays: when the first read fails, many others are still running in TensorStore.
    rng = np.random.default_rng(0)
    sharding = NamedSharding(mesh, P("fsdp"))
    params = {
        f"w{i}": jax.device_put(rng.standard_normal((256, 64), np.float32), sharding)
        for i in range(32)
    }
    opt_state = optax.sgd(0.1).init(params)
    save_steps(tmp_path, params, opt_state, [1, 2, 3])
    for step in ("2", "3"):
        _delete_params_data(tmp_path / step)
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    for _ in range(2):
        step, _, _ = ckpt.restore_params(tmp_path)
        assert step == 1
    gc.collect()
    assert not reported, [f"{u.object!r}: {u.exc_value!r}" for u in reported]
