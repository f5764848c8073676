"""Replaced-token detection end to end: a one-layer ELECTRA trained through the pretraining
loop on the 8 simulated devices with gradient accumulation, resumed bit-exactly from a
checkpoint; the run opened as its discriminator with its generator beside it (alone and on a
mesh), written to transformers' format, and fine-tuned from (config.init_from)."""

from __future__ import annotations

import logging
import pathlib
import shutil

import jax
import numpy as np
import pytest

import bertjax
from bertjax.inference import InferenceError
from bertjax.nn import sharding
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.objectives import rtd
from bertjax.pretrain.settings import PretrainSettings
from configs import electra_tiny
from tests.helpers.replaced_tokens import opened_in_a_fresh_process, scores
from tests.helpers.trainer import finetune_in_place, read_losses, short_run_config

TEXTS = ["the cat sat on the mat today", "dogs run fast in the park", "one"]


def _config(data_dir: pathlib.Path):
    config = short_run_config(
        electra_tiny,
        data_dir,
        steps=8,
        batch_size=16,
        warmup_steps=2,
        eval_every=8,
        eval_batches=2,
        checkpoint_every=4,
    )
    config.model.update(
        dict(num_layers=1, hidden_size=64, num_heads=1, intermediate_size=128, embedding_size=32)
    )
    config.update(generator_hidden_fraction=0.5, grad_accum_steps=2, mesh_shape=(4, 2, 1))
    config.fill_mask_samples = 2
    return config


@pytest.mark.slow
def test_rtd_trains_sharded_with_accumulation_and_resumes_bit_exactly(
    synthetic_data, tmp_path, monkeypatch, caplog
):
    settings = PretrainSettings.from_config(_config(synthetic_data))
    # Any generator counts as too strong here: each evaluation logs the caution.
    monkeypatch.setattr(rtd, "GENERATOR_TOO_STRONG", -1.0)
    with caplog.at_level(logging.WARNING):
        straight = trainer.train_and_evaluate(settings, str(tmp_path / "straight"))
    assert "step 8: the generator predicts" in caplog.text
    assert straight["steps"] == 8
    metrics = straight["eval"]
    for name in ("discriminator_accuracy", "replaced_recall", "generator_accuracy"):
        assert 0.0 <= metrics[f"eval/{name}"] <= 1.0
    assert 0.0 < metrics["eval/replaced_share"] < 0.2
    assert straight["baselines"]["eval/discriminator_accuracy"] == pytest.approx(
        metrics["eval/all_original_accuracy"]
    )
    assert len(straight["samples"]) == 2  # the discriminator's marks on held-out text

    # The same run, its step-8 checkpoint lost: it resumes from step 4 and ends identically.
    resumed_dir = tmp_path / "resumed"
    trainer.train_and_evaluate(settings, str(resumed_dir))
    shutil.rmtree(resumed_dir / "checkpoints" / "8")
    trainer.train_and_evaluate(settings, str(resumed_dir))
    expected, resumed = read_losses(tmp_path / "straight"), read_losses(resumed_dir)
    assert sorted(expected) == list(range(1, 9))
    assert [resumed[s] for s in range(1, 9)] == [expected[s] for s in range(1, 9)]
    _, straight_params, _ = bertjax.load(tmp_path / "straight")
    _, resumed_params, _ = bertjax.load(resumed_dir)
    assert set(straight_params) == {"bert", "discriminator_head", "generator"}
    for a, b in zip(jax.tree.leaves(straight_params), jax.tree.leaves(resumed_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def rtd_run(synthetic_data, tmp_path_factory) -> pathlib.Path:
    """A short RTD run (the settings above, on the 8 devices)."""
    workdir = tmp_path_factory.mktemp("rtd") / "run"
    trainer.train_and_evaluate(PretrainSettings.from_config(_config(synthetic_data)), workdir)
    return workdir


@pytest.mark.slow
def test_an_rtd_run_opens_as_discriminator_and_generator_alone_on_a_mesh_and_exported(
    rtd_run, tmp_path
):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model = bertjax.Model.load(rtd_run)
    assert set(model.networks) == {"generator"}
    generator = model.networks["generator"]
    assert generator.config.hidden_size == 32  # half the discriminator's 64
    marks = model.replaced(TEXTS)
    assert [len(m) for m in marks] == [len(model.tokenizer.encode(t)) for t in TEXTS]
    assert all(0.0 < m["score"] < 1.0 and m["replaced"] == (m["score"] > 0.5) for m in marks[0])
    with pytest.raises(InferenceError, match=r"networks\['generator'\]\.fill_mask"):
        model.fill_mask("the [MASK] sat on the mat")
    filled = generator.fill_mask("the [MASK] sat on the mat", top_k=3)
    assert len(filled) == 3
    with pytest.raises(InferenceError, match="no replaced-token detection head"):
        generator.replaced(TEXTS)

    # Batches run unpadded by default (the encoder's packed_length): the padded path agrees.
    padded = bertjax.Model.load(rtd_run, unpad=False)
    np.testing.assert_allclose(
        np.concatenate(scores(padded, TEXTS)), np.concatenate(scores(model, TEXTS)), atol=1e-5
    )
    # Each text's marks alone are its marks among the others.
    for text, marks in zip(TEXTS, scores(model, TEXTS)):
        np.testing.assert_allclose([t["score"] for t in model.replaced(text)], marks, atol=1e-5)

    # On the 8-device mesh: the same answers.
    on_mesh = bertjax.Model.load(rtd_run, mesh=sharding.make_mesh((4, 2, 1)))
    np.testing.assert_allclose(
        np.concatenate(scores(on_mesh, TEXTS)), np.concatenate(scores(model, TEXTS)), atol=1e-5
    )
    for ours, theirs in zip(
        filled, on_mesh.networks["generator"].fill_mask("the [MASK] sat on the mat", top_k=3)
    ):
        assert ours["token"] == theirs["token"]
        assert ours["score"] == pytest.approx(theirs["score"], abs=1e-5)

    # save_hf: the discriminator as ElectraForPreTraining, the generator inside as
    # ElectraForMaskedLM; bertjax and transformers read both back with the same outputs.
    model.save_hf(tmp_path / "export")
    exported = bertjax.Model.load(tmp_path / "export")
    np.testing.assert_allclose(
        np.concatenate(scores(exported, TEXTS)), np.concatenate(scores(model, TEXTS)), atol=1e-6
    )
    discriminator = transformers.ElectraForPreTraining.from_pretrained(
        tmp_path / "export", attn_implementation="eager"
    ).eval()
    encoded = model.encode(TEXTS[:1])
    with torch.no_grad():
        logits = discriminator(
            input_ids=torch.from_numpy(encoded["input_ids"]).long(),
            attention_mask=torch.from_numpy(encoded["input_mask"]).long(),
        ).logits.numpy()[0, 1:-1]
    probabilities = torch.sigmoid(torch.from_numpy(logits)).numpy()
    np.testing.assert_allclose(probabilities, scores(model, TEXTS)[0], atol=1e-5)
    masked_lm = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "export" / "generator")
    assert masked_lm.config.hidden_size == 32


@pytest.mark.slow
def test_finetuning_from_an_rtd_run_starts_from_its_discriminator(rtd_run, tmp_path):
    tuned = finetune_in_place(rtd_run, tmp_path)
    discriminator = bertjax.Model.load(rtd_run)
    for a, b in zip(
        jax.tree.leaves(tuned.params["bert"]["encoder"]),
        jax.tree.leaves(discriminator.params["bert"]["encoder"]),
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-8)
    assert tuned.config.hidden_size == 64  # the discriminator's width, not the generator's


@pytest.mark.slow
def test_an_rtd_run_opens_in_a_fresh_process_alone_and_on_a_mesh(rtd_run, tmp_path):
    out = opened_in_a_fresh_process(rtd_run, TEXTS, cwd=tmp_path)
    assert out["alone"]["model"].startswith("Model(ELECTRA L1/H64/A1/E32"), out
    assert out["alone"]["generator"] == out["mesh"]["generator"] == 32
    in_process = bertjax.Model.load(rtd_run)
    for name in ("alone", "mesh"):
        np.testing.assert_allclose(
            np.concatenate(out[name]["scores"]),
            np.concatenate(scores(in_process, TEXTS)),
            atol=1e-5,
        )
    assert [t for t, _ in out["mesh"]["filled"]] == [t for t, _ in out["alone"]["filled"]]
    np.testing.assert_allclose(
        [s for _, s in out["mesh"]["filled"]], [s for _, s in out["alone"]["filled"]], atol=1e-5
    )
