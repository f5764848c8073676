"""What checkpoint integrity costs per save and per restore, on a BERT-small-sized state.

    python -m benchmarks.checkpoint                        # BERT-small, one device
    python -m benchmarks.checkpoint --preset base --rounds 3
    python -m benchmarks.checkpoint --devices 8            # sharded over 8 simulated devices

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
Each is a side of benchmarks.harness.timing, run in that order in every round (the checks'
first calls, which compile, are timed apart); medians over the rounds are printed, and the
check as a share of the plain save.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.harness import fixtures, report, timing
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import checkpoint, integrity


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", help="a BertConfig preset (default small)")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--devices", type=int, default=1, help="simulated CPU devices to shard over"
    )
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    report.add_json_flag(parser)
    return parser.parse_args(argv)


def random_state(config: BertConfig, devices: int):
    """(params, opt_state) at the model's shapes, random finite values, placed on devices."""
    rng = np.random.default_rng(1)
    mesh = jax.make_mesh((devices,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))

    def place(values: np.ndarray) -> jax.Array:
        # Shard the first axis that divides evenly; small vectors stay replicated.
        axes = [None] * values.ndim
        for i, size in enumerate(values.shape):
            if size % devices == 0 and size >= devices:
                axes[i] = "fsdp"
                break
        return jax.device_put(values, NamedSharding(mesh, P(*axes)))

    def moment(x: jax.Array, scale: float) -> jax.Array:
        return place((rng.standard_normal(x.shape, np.float32) * scale).astype(x.dtype))

    params = jax.tree.map(place, fixtures.random_params(config, seed=0, std=0.02))
    opt_state = optax.adamw(1e-4).init(params)
    adam = opt_state[0]._replace(
        mu=jax.tree.map(lambda x: moment(x, 1e-3), params),
        nu=jax.tree.map(lambda x: moment(x, 1e-6), params),
    )
    return params, (adam,) + tuple(opt_state[1:])


@jax.jit
def _params_finite(leaves):
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def old_check(params) -> np.ndarray:
    """What a save checked before: NaN/inf flags of the parameters only."""
    return np.asarray(_params_finite(jax.tree.leaves(params)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.devices > 1:  # before jax makes its CPU client (report.start asks for devices)
        report.simulate_devices(args.devices)
    machine = report.start("checkpoint", argv)
    config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
    params, opt_state = random_state(config, args.devices)
    leaves = jax.tree.leaves((params, opt_state))
    megabytes = sum(x.nbytes for x in leaves) / 2**20
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"BERT-{args.preset}: {n_params / 1e6:.1f}M parameters, {len(leaves)} leaves with the "
        f"AdamW state, {megabytes:.0f} MiB; {args.devices} {jax.devices()[0].platform} device(s)"
    )
    trees = {checkpoint.PARAMS_ITEM: params, checkpoint.OPT_STATE_ITEM: opt_state}
    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bertjax_checkpoint_bench_"))
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
    round_ = {"step": 0, "restored": None}

    def plain_save() -> None:
        round_["step"] += 1
        meta = {"step": round_["step"]}
        items = {
            checkpoint.PARAMS_ITEM: ocp.args.StandardSave(params),
            checkpoint.OPT_STATE_ITEM: ocp.args.StandardSave(opt_state),
            checkpoint.META_ITEM: ocp.args.JsonSave(meta),
        }
        plain.save(round_["step"], args=ocp.args.Composite(**items))

    def our_save() -> None:
        meta = {"step": round_["step"]}
        ours.save(round_["step"], params=params, opt_state=opt_state, meta=meta)

    def plain_restore():
        items = {
            checkpoint.PARAMS_ITEM: ocp.args.StandardRestore(abstract[0]),
            checkpoint.OPT_STATE_ITEM: ocp.args.StandardRestore(abstract[1]),
            checkpoint.META_ITEM: ocp.args.JsonRestore(),
        }
        restored = plain.restore(round_["step"], args=ocp.args.Composite(**items))
        return dict(restored.items())  # a pytree the timer waits on

    def our_restore():
        restored = ours.restore(abstract_params=abstract[0], abstract_opt_state=abstract[1])
        round_["restored"] = restored
        return restored

    def verify() -> None:
        restored = round_["restored"]
        restored_trees = {
            checkpoint.PARAMS_ITEM: restored.params,
            checkpoint.OPT_STATE_ITEM: restored.opt_state,
        }
        # The meta item as written, integrity record included (restore strips it).
        step = round_["step"]
        saved_meta = json.loads((root / "bertjax" / str(step) / "meta" / "metadata").read_text())
        integrity.verify(step, saved_meta, restored_trees)

    sides = {
        "check": lambda: integrity.summarise(trees),
        "old check": lambda: old_check(params),
        "orbax save (blocking)": plain_save,
        "orbax save (finishing)": plain.wait_until_finished,
        "bertjax save (blocking)": our_save,
        "bertjax save (finishing)": ours.wait_until_finished,
        "orbax restore": plain_restore,
        "restore incl. verify": our_restore,
        "verify": verify,
    }
    try:
        found = timing.time_rounds(
            sides,
            rounds=args.rounds,
            warmup={name: int(name in ("check", "old check")) for name in sides},
        )
    finally:
        ours.close()
        plain.close()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"first call (compiles): check {found['check'].first:.2f} s, "
        f"old check {found['old check'].first:.2f} s"
    )
    medians = {name: t.median for name, t in found.items()}
    for who in ("orbax", "bertjax"):
        blocking, finishing = found[f"{who} save (blocking)"], found[f"{who} save (finishing)"]
        total = timing.Timing(
            f"{who} save (total)",
            tuple(a + b for a, b in zip(blocking.rounds, finishing.rounds)),
        )
        medians[total.name] = total.median
    print(f"medians over {args.rounds} rounds (seconds):")
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
    report.finish("checkpoint", args, medians, machine)
    return medians


if __name__ == "__main__":
    main()
