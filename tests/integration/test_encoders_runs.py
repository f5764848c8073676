"""The integration tests of test_encoders.py (tests/unit/), with its helpers."""

import jax
import numpy as np
import pytest

import bertjax
from bertjax import encoders
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir
from bertjax.finetune import loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks.qa import model as qa_model
from tests.helpers.corpora import finetune_config
from tests.helpers.encoders import (
    ATOL,
    CASES,
    CONFIG,
    PARITY_BATCH,
    PARITY_LR,
    PARITY_STEPS,
    SEQ,
    TOKENIZER,
    _batch,
    _hf_model,
    _our_logits,
    _parity_batches,
    _run_torch,
    _topic_csv,
    _torch,
    _torch_loss,
)
from tests.helpers.finetune_hf_torch import TORCH_WARMUP_STEPS, torch_adamw
from tests.helpers.finetuning import data_parallel_finetuning
from tests.helpers.params import max_diff


@pytest.mark.slow
def test_finetuning_classification_from_a_modernbert_directory(tmp_path):
    _, transformers = _torch()

    theirs = _hf_model("ModernBertForMaskedLM", CONFIG, seed=7)
    theirs.save_pretrained(tmp_path / "init")
    TOKENIZER.save_hf(tmp_path / "init")
    config = finetune_config(
        tmp_path / "init",
        task="classification",
        **{
            "data.train": str(_topic_csv(tmp_path / "train.csv", 128, seed=1)),
            "data.validation": str(_topic_csv(tmp_path / "dev.csv", 32, seed=2)),
            "num_epochs": 3,
            "optimizer.learning_rate": 1e-3,
        },
    )
    loop.finetune(FinetuneSettings.from_config(config), tmp_path / "run")
    meta = checkpoint_lib.read_meta(tmp_path / "run" / rundir.BEST_CHECKPOINT_DIR)
    assert meta["model_config"][encoders.FAMILY_KEY] == "modernbert"
    model = bertjax.Model.load(tmp_path / "run")
    assert encoders.family_of(model.config).name == "modernbert"
    texts = ["paris river museum", "king painting history"]
    assert [p["label"] for p in model.predict(texts)] == ["art", "place"]
    # The fine-tuned model travels to transformers with the same logits.
    model.save_hf(tmp_path / "export")
    exported = transformers.ModernBertForSequenceClassification.from_pretrained(
        tmp_path / "export", attn_implementation="eager"
    ).eval()
    ids, mask = _batch()
    ours = _our_logits(model.config, model.head, model.params, ids, mask)
    assert max_diff(ours, _run_torch(exported, ids, mask).logits.numpy()) < ATOL


@pytest.mark.slow  # 20 steps on both sides and two exports: about 15 s a case on two cores
@pytest.mark.parametrize("case", list(CASES))
def test_fine_tuning_steps_equal_transformers_step_for_step(case, tmp_path):
    from bertjax.engine import optim

    torch, transformers = _torch()
    head, cls_suffix, pooling = CASES[case]
    cls_name = f"ModernBertFor{cls_suffix}"
    outputs = {} if head.task == qa_model.TASK else {"num_labels": head.num_outputs}
    reference = _hf_model(cls_name, CONFIG, seed=7, classifier_pooling=pooling, **outputs)
    reference.save_pretrained(tmp_path / "start")
    reference.train()
    config, params, read_head, _ = encoders.read_transformers(tmp_path / "start")
    assert read_head.task == head.task and read_head.num_outputs == head.num_outputs
    assert config.classifier_pooling == pooling

    torch_optimizer, schedule = torch_adamw(
        reference, PARITY_STEPS, PARITY_LR, no_decay=("bias", "norm")
    )
    settings = optim.OptimizerSettings(
        learning_rate=PARITY_LR, warmup_steps=TORCH_WARMUP_STEPS, total_steps=PARITY_STEPS
    )
    ft = data_parallel_finetuning(config, read_head, settings, batch=PARITY_BATCH, seq=SEQ)
    state = ft.state.init(jax.random.key(0))
    state = state.replace(params=jax.device_put(params, ft.state.shardings.params))
    for step, batch in enumerate(_parity_batches(head)):
        state, metrics = ft.train_step(
            state, jax.device_put(batch, ft.batch_sharding), jax.random.key(1)
        )
        loss = _torch_loss(reference, head, batch)
        torch_optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        torch_optimizer.step()
        schedule.step()
        message = f"step {step + 1}"
        np.testing.assert_allclose(float(metrics["train/loss"]), loss.item(), 1e-4, 0, message)
        np.testing.assert_allclose(
            float(metrics["train/grad_norm"]), grad_norm.item(), 1e-4, 0, message
        )

    family = encoders.family_of(config)
    family.write_transformers(config, jax.device_get(state.params), tmp_path / "ours", head=head)
    hf_class = getattr(transformers, cls_name)
    ours = hf_class.from_pretrained(tmp_path / "ours", attn_implementation="eager").state_dict()
    start = hf_class.from_pretrained(tmp_path / "start", attn_implementation="eager").state_dict()
    theirs = reference.state_dict()
    # The steps moved the parameters far past the tolerance: agreement is not standing still.
    assert max(float((theirs[k] - start[k]).abs().max()) for k in ours) > 5e-3
    for key, value in ours.items():
        np.testing.assert_allclose(
            value.numpy(), theirs[key].detach().numpy(), atol=1e-4, rtol=0, err_msg=key
        )
