"""The trainer's prepared data and config, what train.py does with a config, the losses a run
logged, one train step, and the values the fixed short run recorded (a change detector)."""

import json
import pathlib

import jax
import ml_collections
import pytest

import bertjax
from bertjax import data as data_lib
from bertjax.engine import steps
from bertjax.finetune import loop as finetune_loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.objective import build_pretraining
from bertjax.pretrain.settings import PretrainSettings
from configs import tiny
from tests.helpers.corpora import finetune_config

SEQ_LEN = 64


PREDICTIONS = 10


@pytest.fixture
def data_dir(synthetic_data) -> pathlib.Path:
    """The synthetic corpus prepared with SEQ_LEN and PREDICTIONS (conftest.py)."""
    return synthetic_data


def short_run_config(
    recipe,
    data_dir: pathlib.Path,
    *,
    steps: int,
    batch_size: int,
    warmup_steps: int,
    seq_len: int = SEQ_LEN,
    predictions: int = PREDICTIONS,
    log_every: int = 1,
    eval_every: int = 1000,
    eval_batches: int = 1,
    checkpoint_every: int | None = None,
    **fields,
) -> ml_collections.ConfigDict:
    """`recipe`'s config (a module of configs/) for a short run over the data prepared in
    `data_dir`: its length, batch, schedule and what it logs, evaluates and keeps (a checkpoint
    at the last step unless `checkpoint_every` says otherwise), then `fields` (dotted names, as
    train.py's --config. flags)."""
    config = recipe.get_config()
    config.data.dir = str(data_dir)
    config.data.max_seq_length = seq_len
    config.data.max_predictions_per_seq = predictions
    config.batch_size = batch_size
    config.num_train_steps = steps
    config.log_every_steps = log_every
    config.eval_every_steps = eval_every
    config.eval_batches = eval_batches
    config.checkpoint_every_steps = checkpoint_every or steps
    config.optimizer.warmup_steps = warmup_steps
    config.update_from_flattened_dict(fields)
    return config


def make_config(data_dir: pathlib.Path, **overrides) -> ml_collections.ConfigDict:
    """configs/tiny.py for 20 steps of 32 rows over `data_dir`, then `overrides`."""
    config = short_run_config(
        tiny, data_dir, steps=20, batch_size=32, warmup_steps=5, eval_batches=4, checkpoint_every=10
    )
    config.fill_mask_samples = 0
    config.update_from_flattened_dict(overrides)
    return config


def train(config: ml_collections.ConfigDict, workdir) -> dict:
    """What train.py does with a config: read it into settings, then run."""
    return trainer.train_and_evaluate(PretrainSettings.from_config(config), str(workdir))


def masking(config: ml_collections.ConfigDict):
    return PretrainSettings.from_config(config).data.masking


def read_losses(workdir: pathlib.Path) -> dict[int, float]:
    """Step -> train/loss; a step logged twice (before a kill and after resuming) keeps the last."""
    losses = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "train/loss" in record:
            losses[record["step"]] = record["train/loss"]
    return losses


def _one_step(data_dir, config, spoil=None):
    """(params before, params after, metrics) of one train step; `spoil` edits the params first."""
    tokenizer = bertjax.Tokenizer.load(data_dir / "tokenizer.model")
    settings = PretrainSettings.from_config(config)
    setup = build_pretraining(settings, settings.model_config(tokenizer))
    loader = data_lib.make_loader(
        data_dir,
        batch_size=config.batch_size,
        seed=0,
        masking=masking(config),
    )
    with jax.set_mesh(setup.mesh):
        state = setup.state.init(jax.random.key(0))
        if spoil is not None:
            state = state.replace(params=spoil(state.params))
        before = jax.device_get(state.params)
        batch = steps.global_batch(next(loader), setup.batch_sharding, 1)
        state, metrics = setup.train_step(state, batch, jax.random.key(1))
    return before, jax.device_get(state.params), jax.device_get(metrics)


# A change detector, not a check of correctness: the losses of steps 1..6 and the sum of
# |params| after step 6 of the fixed short run (test_trainer_unit.py), recorded from bertjax's
# own output when the trainer was split into settings/steps/trainer (bit-identical to the loop
# before it) and again when dropout masks became a counter-based hash
# (masks.dropout_keep_mask: other draws, the same rate). A change to the data order,
# masking, initialisation, dropout, the step or the optimizer moves them; a refactoring must
# not. What makes these numbers right is tested against independent references: the step
# against transformers' BertForPreTraining and torch's AdamW (tests/parity/
# test_pretraining_parity.py), accumulation against one large batch (tests/integration/
# test_trainer.py), the dropout masks' rate (tests/unit/test_attention.py).
RECORDED_LOSSES = [
    6.587389945983887,
    6.5945000648498535,
    6.502294063568115,
    6.431214809417725,
    6.1194682121276855,
    6.0691986083984375,
]


RECORDED_PARAM_ABS_SUM = 8639.590831310099


def finetune_in_place(init_from, tmp_path: pathlib.Path) -> bertjax.Model:
    """A classifier fine-tuned from `init_from` for one epoch with steps too small to move its
    encoder (learning rate 1e-12), opened as a user opens it: what it started from."""
    rows = [f"{'the cat sat' if i % 2 else 'dogs run fast'} {i},{i % 2}" for i in range(64)]
    csv = tmp_path / "train.csv"
    csv.write_text("sentence,label\n" + "\n".join(rows) + "\n")
    config = finetune_config(
        init_from,
        task="classification",
        **{"data.train": str(csv), "data.validation": str(csv), "num_epochs": 1},
    )
    config.optimizer.learning_rate = 1e-12
    finetune_loop.finetune(FinetuneSettings.from_config(config), tmp_path / "ft")
    return bertjax.Model.load(tmp_path / "ft")
