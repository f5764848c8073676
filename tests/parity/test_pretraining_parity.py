"""Pretraining steps against transformers' BertForPreTraining trained by a plain torch loop:
the independent reference for what the fixed short run in tests/unit/test_trainer_unit.py
records (its losses and parameters), which only detects change.

The same weights, the same loader batches of the synthetic corpus, dropout off, and the same
optimizer on both sides (AdamW with BERT's decay mask, eps 1e-6, weight decay 0.01, clipping at
global norm 1.0, linear warmup then linear decay): each step's loss (masked LM plus next
sentence) and gradient norm, and the parameters after the last step, agree.
"""

import jax
import numpy as np
import pytest

import bertjax
from bertjax import data as data_lib
from bertjax.encoders.bert import hf as bert_hf
from bertjax.engine import steps
from bertjax.pretrain.objective import build_pretraining
from bertjax.pretrain.settings import PretrainSettings
from tests.helpers.corpora import ONE_LAYER
from tests.helpers.finetune_hf_torch import TORCH_WARMUP_STEPS, torch_adamw
from tests.helpers.trainer import data_dir, make_config, masking  # noqa: F401 (fixtures)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STEPS = 4
LEARNING_RATE = 2e-3  # the recorded run's
IGNORED = -100  # transformers' label of a position without a masked-LM target
ATOL = 1e-5  # the parameters after the last step


def _torch_inputs(batch) -> dict:
    """BertForPreTraining's arguments for one of bertjax's pretraining batches: the masked
    positions' targets as labels (every other position ignored)."""
    labels = np.full(batch["input_ids"].shape, IGNORED, np.int64)
    rows = np.arange(labels.shape[0])[:, None].repeat(batch["masked_lm_positions"].shape[1], 1)
    real = batch["masked_lm_weights"] > 0
    labels[rows[real], batch["masked_lm_positions"][real]] = batch["masked_lm_ids"][real]
    return {
        "input_ids": torch.tensor(batch["input_ids"]).long(),
        "token_type_ids": torch.tensor(batch["segment_ids"]).long(),
        "attention_mask": torch.tensor(batch["input_mask"]).long(),
        "labels": torch.tensor(labels),
        "next_sentence_label": torch.tensor(batch["next_sentence_labels"]).long(),
    }


def test_pretraining_steps_equal_transformers_step_for_step(data_dir, tmp_path):
    config = make_config(
        data_dir,
        num_train_steps=STEPS,
        batch_size=16,
        **{
            **ONE_LAYER,  # the tiny preset's step, one layer of it: the same code, less to compile
            "model.hidden_dropout": 0.0,
            "model.attention_dropout": 0.0,
            "optimizer.learning_rate": LEARNING_RATE,
            "optimizer.warmup_steps": TORCH_WARMUP_STEPS,
        },
    )
    settings = PretrainSettings.from_config(config)
    tokenizer = bertjax.Tokenizer.load(data_dir / "tokenizer.model")
    model_config = settings.model_config(tokenizer)
    setup = build_pretraining(settings, model_config)
    loader = data_lib.make_loader(
        data_dir, batch_size=config.batch_size, seed=0, masking=masking(config)
    )
    with jax.set_mesh(setup.mesh):
        state = setup.state.init(jax.random.key(0))
        bert_hf.save(model_config, jax.device_get(state.params), tmp_path / "start")
        reference = transformers.BertForPreTraining.from_pretrained(
            tmp_path / "start", attn_implementation="eager"
        ).train()
        optimizer, schedule = torch_adamw(
            reference, STEPS, LEARNING_RATE, no_decay=("bias", "LayerNorm")
        )
        for step in range(1, STEPS + 1):
            batch = next(loader)
            state, metrics = setup.train_step(
                state, steps.global_batch(batch, setup.batch_sharding, 1), jax.random.key(step)
            )
            loss = reference(**_torch_inputs(batch)).loss
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            np.testing.assert_allclose(float(metrics["train/loss"]), loss.item(), rtol=1e-5)
            np.testing.assert_allclose(
                float(metrics["train/grad_norm"]), grad_norm.item(), rtol=1e-4
            )
        bert_hf.save(model_config, jax.device_get(state.params), tmp_path / "ours")
    ours = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours").state_dict()
    start = transformers.BertForPreTraining.from_pretrained(tmp_path / "start").state_dict()
    theirs = reference.state_dict()
    # The steps moved the parameters far past the tolerance: agreement is not standing still.
    assert max(float((theirs[k] - start[k]).abs().max()) for k in ours) > 100 * ATOL
    for key, value in ours.items():
        np.testing.assert_allclose(
            value.numpy(), theirs[key].detach().numpy(), atol=ATOL, rtol=0, err_msg=key
        )
