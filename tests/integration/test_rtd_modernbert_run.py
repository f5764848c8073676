"""Replaced-token detection on ModernBERT end to end: a two-layer ModernBERT (one global layer,
one local) trained on packed documents on the 8 simulated devices with gradient accumulation,
resumed bit-exactly from a checkpoint; the run opened in a fresh process as its
discriminator with its generator beside it, its encoder exported as a transformers
ModernBertModel, and fine-tuned from (config.init_from)."""

from __future__ import annotations

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

import bertjax
from bertjax import encoders
from bertjax.inference import InferenceError
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.settings import PretrainSettings
from configs import modernbert_tiny
from tests.helpers.replaced_tokens import opened_in_a_fresh_process, scores
from tests.helpers.trainer import finetune_in_place, read_losses, short_run_config

TEXTS = ["the cat sat on the mat today", "dogs run fast in the park"]
STEPS = 12


def _config(data_dir: pathlib.Path):
    """configs/modernbert_tiny.py with objective rtd on conftest's packed data, two layers of
    64 and a generator half as wide (32, one head)."""
    config = short_run_config(
        modernbert_tiny,
        data_dir,
        steps=STEPS,
        batch_size=16,
        warmup_steps=2,
        predictions=20,  # 30% of 64
        eval_every=STEPS,
        eval_batches=2,
        checkpoint_every=6,
    )
    config.update(objective="rtd", generator_hidden_fraction=0.5, fill_mask_samples=2)
    config.model.update(
        dict(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=96, local_attention=16)
    )
    config.update(batch_warmup_start=16, batch_warmup_steps=0, grad_accum_steps=2)
    config.mesh_shape = (4, 2, 1)
    config.optimizer.decay_steps = 0
    return config


@pytest.fixture(scope="module")
def rtd_run(packed_data, tmp_path_factory):
    """(work directory, summary, settings) of the run above."""
    workdir = tmp_path_factory.mktemp("modernbert_rtd") / "run"
    settings = PretrainSettings.from_config(_config(packed_data[1]))
    return workdir, trainer.train_and_evaluate(settings, workdir), settings


@pytest.mark.slow
def test_a_modernbert_rtd_run_learns_reports_and_resumes_bit_exactly(rtd_run, tmp_path):
    workdir, summary, settings = rtd_run
    assert summary["steps"] == STEPS
    losses = read_losses(workdir)
    assert np.mean([losses[s] for s in (STEPS - 1, STEPS)]) < np.mean([losses[s] for s in (1, 2)])
    metrics = summary["eval"]
    for name in (
        "generator_accuracy",
        "discriminator_accuracy",
        "replaced_precision",
        "replaced_recall",
        "replaced_share",
        "replaced_auc",
    ):
        assert 0.0 <= metrics[f"eval/{name}"] <= 1.0, name
    assert 0.0 < metrics["eval/replaced_share"] < 0.3
    assert len(summary["samples"]) == 2  # the discriminator's marks on held-out text
    _, params, _ = bertjax.load(workdir)
    assert set(params) == {"bert", "discriminator_head", "generator"}

    # The same run, its last checkpoint lost: it resumes from step 6 and ends identically.
    resumed = tmp_path / "resumed"
    shutil.copytree(workdir, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))
    trainer.train_and_evaluate(settings, resumed)
    again = read_losses(resumed)
    assert [again[s] for s in range(1, STEPS + 1)] == [losses[s] for s in range(1, STEPS + 1)]
    _, resumed_params, _ = bertjax.load(resumed)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(resumed_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_modernbert_rtd_run_opens_in_a_fresh_process_and_exports_its_encoder(rtd_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    workdir, _, _ = rtd_run
    out = opened_in_a_fresh_process(workdir, TEXTS, cwd=tmp_path)
    model = bertjax.Model.load(workdir)
    marks = scores(model, TEXTS)
    assert [len(s) for s in marks] == [len(model.tokenizer.encode(t)) for t in TEXTS]
    filled = model.networks["generator"].fill_mask("the [MASK] sat on the mat", top_k=3)
    assert len(filled) == 3
    for name in ("alone", "mesh"):  # one device, and the 8 devices' mesh
        opened = out[name]
        assert opened["model"].startswith("Model(ModernBERT L2/H64/A2"), opened
        assert opened["generator"] == 32
        np.testing.assert_allclose(
            np.concatenate(opened["scores"]), np.concatenate(marks), atol=1e-5
        )
        assert [f["token"] for f in filled] == [t for t, _ in opened["filled"]]
        np.testing.assert_allclose(
            [f["score"] for f in filled], [s for _, s in opened["filled"]], atol=1e-5
        )

    # save_hf: the discriminator's encoder as transformers' ModernBertModel, nothing else
    # (transformers has no ModernBERT replaced-token class, nor one for the generator).
    model.save_hf(tmp_path / "export")
    written = json.loads((tmp_path / "export" / "config.json").read_text())
    assert written["architectures"] == ["ModernBertModel"]
    assert not (tmp_path / "export" / "generator").exists()
    with pytest.raises(InferenceError, match="transformers has no class for this model"):
        model.networks["generator"].save_hf(tmp_path / "generator")
    encoder = transformers.AutoModel.from_pretrained(
        tmp_path / "export", attn_implementation="eager"
    ).eval()
    encoded = model.encode(TEXTS[:1])
    with torch.no_grad():
        theirs = encoder(
            input_ids=torch.from_numpy(encoded["input_ids"]).long(),
            attention_mask=torch.from_numpy(encoded["input_mask"]).long(),
        ).last_hidden_state.numpy()
    config = model.config
    ours, _ = (
        encoders.family_of(config)
        .module(config)
        .apply({"params": model.params["bert"]}, encoded["input_ids"], None, encoded["input_mask"])
    )
    np.testing.assert_allclose(theirs, np.asarray(ours), atol=1e-4)


@pytest.mark.slow
def test_finetuning_from_a_modernbert_rtd_run_starts_from_its_discriminator(rtd_run, tmp_path):
    workdir, _, _ = rtd_run
    tuned = finetune_in_place(workdir, tmp_path)
    discriminator = bertjax.Model.load(workdir)
    assert tuned.config.hidden_size == 64  # the discriminator's width, not the generator's
    for layer in ("embeddings", "layer_0", "layer_1", "final_norm"):
        for a, b in zip(
            jax.tree.leaves(tuned.params["bert"][layer]),
            jax.tree.leaves(discriminator.params["bert"][layer]),
        ):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-8)
