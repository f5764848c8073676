"""What a fine-tuning run's checkpoints say about it (`checkpoint_meta`), and the check that
an existing checkpoint belongs to the run that would resume it (`check_resumable`)."""

from __future__ import annotations

from typing import Any

from bertjax import encoders
from bertjax.capability import HeadSpec
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune.prepared import PreparedRun


class HeadMismatchError(ConfigError):
    """A run's task or labels differ from the head of the checkpoint it would resume."""


def checkpoint_meta(run: PreparedRun, seed: int, best: dict | None) -> dict:
    """The meta a seed's checkpoints carry: the head, architecture, tokenizer, settings and
    data they were trained with, and the best evaluation so far."""
    return {
        "head": run.ft.head.to_dict(),
        "model_config": encoders.config_to_dict(run.ft.model_config),
        "tokenizer_fingerprint": run.tokenizer.fingerprint,
        "config": run.settings.config,
        "seed": seed,
        "train_examples": len(run.task.train),
        "steps_per_epoch": run.steps_per_epoch,
        "batch_order": run.settings.run.batch_order,
        "max_seq_length": run.settings.data.max_seq_length,
        "best": best,
    }


def check_resumable(meta: dict, run: PreparedRun, directory) -> None:
    """Fails, saying how, unless an existing checkpoint belongs to this run's task and data."""
    if "head" not in meta:
        raise HeadMismatchError(
            f"the checkpoints in {directory} are not a fine-tuning run's (a pretraining run's?); "
            "give fine-tuning its own --workdir (and the pretraining run as config.init_from)"
        )
    head = HeadSpec.from_dict(meta["head"])
    if head != run.ft.head and (head.task, head.labels) == (run.ft.head.task, run.ft.head.labels):
        saved, asked = _option_differences(head, run.ft.head)
        article = "an" if head.task[0] in "aeiou" else "a"
        raise HeadMismatchError(
            f"the checkpoint in {directory} is {article} {head.task} head with {saved}, but this "
            f"run asks {asked}; use another --workdir, or the settings it was trained with"
        )
    if head != run.ft.head:
        raise HeadMismatchError(
            f"the checkpoint in {directory} is a {head.describe()} head, but this run's task "
            f"is {run.ft.head.describe()}; use another --workdir, or the task and data it was "
            "trained on"
        )
    # The architecture too: a checkpoint that cannot be read onto this model would otherwise
    # be taken for a damaged one.
    rundir.check_compatible(
        meta, run.tokenizer, run.ft.model_config, f"the checkpoint in {directory}"
    )
    saved = {"batch_order": "shuffled", **meta}  # checkpoints from before batch_order
    for key, value in (
        ("train_examples", len(run.task.train)),
        ("steps_per_epoch", run.steps_per_epoch),
        # Another order would take other batches than the interrupted run's.
        ("batch_order", run.settings.run.batch_order),
    ):
        if saved.get(key) != value:
            raise ConfigError(
                f"the checkpoint in {directory} has {key}={saved.get(key)!r}, this run "
                f"{value!r}: it was trained on other data or settings; use another --workdir"
            )


def _option_differences(saved: HeadSpec, asked: HeadSpec) -> tuple[str, str]:
    """The options two heads of one task set differently, as ("pooling='mean'",
    "pooling='cls'"): each option by its own name (a nested one by its last name)."""

    def flat(options: Any, prefix: str = "") -> dict[str, Any]:
        out = {}
        for name, value in (options or {}).items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{name}."))
            else:
                out[f"{prefix}{name}"] = value
        return out

    old = flat(saved.to_dict().get("options"))
    new = flat(asked.to_dict().get("options"))
    names = [n for n in sorted(set(old) | set(new)) if old.get(n) != new.get(n)]

    def shown(values: dict[str, Any]) -> str:
        return ", ".join(f"{n.rsplit('.', 1)[-1]}={values.get(n)!r}" for n in names)

    return shown(old), shown(new)
