"""What checkpoint integrity costs per save and per restore, on a BERT-small-sized state.

    python benchmarks/checkpoint.py                        # BERT-small, one device
    python benchmarks/checkpoint.py --preset base --rounds 3
    python benchmarks/checkpoint.py --devices 8            # sharded over 8 simulated devices

The state is BertForPreTraining's parameters at the preset's shapes plus AdamW's moments,
every float holding random values (a mid-training state: nothing compresses away). Each round
times, in turn:
  check         bertjax.engine.integrity.summarise over params and optimizer state: the fingerprints
                and NaN/inf flags every save records (compiled before the first round)
  old check     what a save checked before: NaN/inf flags of the parameters only
  orbax save    the same three items saved by a plain Orbax CheckpointManager: the time until
                save() returns (blocking) and until the write is on disk (total)
  bertjax save  Checkpointer.save, which runs the check and then the same Orbax save
  orbax restore the plain manager's restore of its step
  restore       Checkpointer.restore, which reads the step and verifies it (`verify`)
  verify        the verification alone, on the restored trees
Medians over the rounds are printed, and the check as a share of the plain save.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", help="a BertConfig preset (default small)")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--devices", type=int, default=1, help="simulated CPU devices to shard over"
    )
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    return parser.parse_args()


ARGS = parse_args()
if ARGS.devices > 1:  # must be set before jax is first imported
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ARGS.devices}"
    )

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from etils import epath  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

# The script runs from a checkout: make `bertjax` importable from the root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bertjax.encoders.bert.config import BertConfig  # noqa: E402
from bertjax.encoders.bert.model import BertForPreTraining  # noqa: E402
from bertjax.engine import checkpoint, integrity  # noqa: E402


def random_state(config: BertConfig, devices: int):
    """(params, opt_state) at the model's shapes, random finite values, placed on devices."""
    ids = jnp.zeros((1, 8), jnp.int32)  # [batch, seq]
    shapes = nn.meta.unbox(
        jax.eval_shape(lambda: BertForPreTraining(config).init(jax.random.key(0), ids)["params"])
    )
    rng = np.random.default_rng(0)
    mesh = jax.make_mesh((devices,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))

    def place(shape: jax.ShapeDtypeStruct, scale: float = 0.02) -> jax.Array:
        values = (rng.standard_normal(shape.shape, np.float32) * scale).astype(shape.dtype)
        # Shard the first axis that divides evenly; small vectors stay replicated.
        axes = [None] * len(shape.shape)
        for i, size in enumerate(shape.shape):
            if size % devices == 0 and size >= devices:
                axes[i] = "fsdp"
                break
        return jax.device_put(values, NamedSharding(mesh, P(*axes)))

    params = jax.tree.map(place, shapes)
    opt_state = optax.adamw(1e-4).init(params)
    adam = opt_state[0]._replace(
        mu=jax.tree.map(lambda x: place(x, 1e-3), params),
        nu=jax.tree.map(lambda x: place(x, 1e-6), params),
    )
    return params, (adam,) + tuple(opt_state[1:])


@jax.jit
def _params_finite(leaves):
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def old_check(params) -> None:
    np.asarray(_params_finite(jax.tree.leaves(params)))


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    config = BertConfig.preset(ARGS.preset, vocab_size=ARGS.vocab_size)
    params, opt_state = random_state(config, ARGS.devices)
    leaves = jax.tree.leaves((params, opt_state))
    megabytes = sum(x.nbytes for x in leaves) / 2**20
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"BERT-{ARGS.preset}: {n_params / 1e6:.1f}M parameters, {len(leaves)} leaves with the "
        f"AdamW state, {megabytes:.0f} MiB; {ARGS.devices} {jax.devices()[0].platform} device(s)"
    )
    trees = {checkpoint.PARAMS_ITEM: params, checkpoint.OPT_STATE_ITEM: opt_state}
    compile_check, _ = timed(integrity.summarise, trees)
    compile_old, _ = timed(old_check, params)
    print(f"first call (compiles): check {compile_check:.2f} s, old check {compile_old:.2f} s")

    root = pathlib.Path(ARGS.dir or tempfile.mkdtemp(prefix="bertjax_checkpoint_bench_"))
    root.mkdir(parents=True, exist_ok=True)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), (params, opt_state)
    )
    plain = ocp.CheckpointManager(
        epath.Path(root / "orbax"),
        item_names=checkpoint.ITEM_NAMES,
        item_handlers=checkpoint._item_handlers(),
        options=ocp.CheckpointManagerOptions(max_to_keep=1),
    )
    ours = checkpoint.Checkpointer(root / "bertjax", max_to_keep=1, save_interval_steps=1)
    times: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    try:
        for step in range(1, ARGS.rounds + 1):
            record("check", timed(integrity.summarise, trees)[0])
            record("old check", timed(old_check, params)[0])

            meta = {"step": step}
            args = ocp.args.Composite(
                **{
                    checkpoint.PARAMS_ITEM: ocp.args.StandardSave(params),
                    checkpoint.OPT_STATE_ITEM: ocp.args.StandardSave(opt_state),
                    checkpoint.META_ITEM: ocp.args.JsonSave(meta),
                }
            )
            start = time.perf_counter()
            plain.save(step, args=args)
            record("orbax save (blocking)", time.perf_counter() - start)
            plain.wait_until_finished()
            record("orbax save (total)", time.perf_counter() - start)

            start = time.perf_counter()
            ours.save(step, params=params, opt_state=opt_state, meta=meta)
            record("bertjax save (blocking)", time.perf_counter() - start)
            ours.wait_until_finished()
            record("bertjax save (total)", time.perf_counter() - start)

            restore_args = ocp.args.Composite(
                **{
                    checkpoint.PARAMS_ITEM: ocp.args.StandardRestore(abstract[0]),
                    checkpoint.OPT_STATE_ITEM: ocp.args.StandardRestore(abstract[1]),
                    checkpoint.META_ITEM: ocp.args.JsonRestore(),
                }
            )
            record("orbax restore", timed(plain.restore, step, args=restore_args)[0])
            seconds, restored = timed(
                ours.restore, abstract_params=abstract[0], abstract_opt_state=abstract[1]
            )
            record("restore incl. verify", seconds)
            restored_trees = {
                checkpoint.PARAMS_ITEM: restored.params,
                checkpoint.OPT_STATE_ITEM: restored.opt_state,
            }
            # The meta item as written, integrity record included (restore strips it).
            saved_meta = json.loads(
                (root / "bertjax" / str(step) / "meta" / "metadata").read_text()
            )
            record("verify", timed(integrity.verify, step, saved_meta, restored_trees)[0])
    finally:
        ours.close()
        plain.close()
        if ARGS.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"medians over {ARGS.rounds} rounds (seconds):")
    for name, value in medians.items():
        print(f"  {name:<26}{value:8.3f}")
    check, old = medians["check"], medians["old check"]
    print(
        f"check per save: {check:.3f} s ({check - old:+.3f} s over the old NaN/inf check); "
        f"{100 * check / medians['orbax save (blocking)']:.0f}% of the plain save's blocking "
        f"part, {100 * check / medians['orbax save (total)']:.0f}% of its total"
    )
    print(
        f"verify per restore: {medians['verify']:.3f} s, "
        f"{100 * medians['verify'] / medians['orbax restore']:.0f}% of the plain restore"
    )


if __name__ == "__main__":
    main()
