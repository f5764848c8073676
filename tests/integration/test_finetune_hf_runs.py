"""The integration tests of test_finetune_hf.py (tests/unit/), with its helpers."""

import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax.encoders.bert import hf as bert_hf
from bertjax.engine import optim
from tests.helpers.finetune_hf import (
    CONFIG,
    HEADS,
    PARITY_BATCH,
    PARITY_LR,
    PARITY_SEQ,
    PARITY_STEPS,
    parity_batches,
    random_params,
)
from tests.helpers.finetune_hf_torch import (
    HF_CLASSES,
    TORCH_WARMUP_STEPS,
    torch_adamw,
    torch_labels,
)
from tests.helpers.finetuning import data_parallel_finetuning


@pytest.mark.parametrize(
    "name,pairs",
    [
        pytest.param("classification", False, marks=pytest.mark.slow),
        pytest.param("classification", True, marks=pytest.mark.slow),
        ("regression", True),
        pytest.param("multi_label", False, marks=pytest.mark.slow),
        pytest.param("token_classification", False, marks=pytest.mark.slow),
    ],
)
def test_fine_tuning_steps_equal_transformers_step_for_step(tmp_path, name, pairs):
    head = HEADS[name]
    config = dataclasses.replace(CONFIG, hidden_dropout=0.0, attention_dropout=0.0)
    params = random_params(head, seed=6)
    bert_hf.save(config, params, tmp_path / "start", head=head)
    cls = HF_CLASSES.get(head.task, transformers.BertForSequenceClassification)
    reference = cls.from_pretrained(tmp_path / "start", attn_implementation="eager").train()
    torch_optimizer, schedule = torch_adamw(
        reference, PARITY_STEPS, PARITY_LR, no_decay=("bias", "LayerNorm")
    )

    settings = optim.OptimizerSettings(
        learning_rate=PARITY_LR, warmup_steps=TORCH_WARMUP_STEPS, total_steps=PARITY_STEPS
    )
    assert (settings.weight_decay, settings.eps, settings.max_grad_norm) == (0.01, 1e-6, 1.0)
    ft = data_parallel_finetuning(config, head, settings, batch=PARITY_BATCH, seq=PARITY_SEQ)
    state = ft.state.init(jax.random.key(0))
    state = state.replace(params=jax.device_put(params, ft.state.shardings.params))
    for batch in parity_batches(head, pairs):
        state, metrics = ft.train_step(
            state, jax.device_put(batch, ft.batch_sharding), jax.random.key(1)
        )
        loss = reference(
            input_ids=torch.tensor(batch["input_ids"]).long(),
            token_type_ids=torch.tensor(batch["segment_ids"]).long(),
            attention_mask=torch.tensor(batch["input_mask"]).long(),
            labels=torch_labels(head, batch["labels"]),
        ).loss
        torch_optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        torch_optimizer.step()
        schedule.step()
        np.testing.assert_allclose(float(metrics["train/loss"]), loss.item(), rtol=1e-4)
        np.testing.assert_allclose(float(metrics["train/grad_norm"]), grad_norm.item(), rtol=1e-4)

    bert_hf.save(config, jax.device_get(state.params), tmp_path / "ours", head=head)
    ours = cls.from_pretrained(tmp_path / "ours", attn_implementation="eager").state_dict()
    start = cls.from_pretrained(tmp_path / "start", attn_implementation="eager").state_dict()
    theirs = reference.state_dict()
    # The steps moved the parameters far past the tolerance, so agreement is not by standing still.
    assert max(float((theirs[k] - start[k]).abs().max()) for k in ours) > 5e-3
    for key, value in ours.items():
        np.testing.assert_allclose(
            value.numpy(), theirs[key].detach().numpy(), atol=1e-4, rtol=0, err_msg=key
        )
