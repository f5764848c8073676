"""ModernBERT pretrained by train.py's road: the modern recipe on packed documents, resumed
bit-exactly during batch warmup, recorded as a ModernBERT checkpoint, opened in a fresh
process on one device and on a mesh, exported to transformers, and continued as a new phase
(context extension) from its checkpoint."""

import json
import shutil

import jax
import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir
from configs import modernbert_tiny
from tests.helpers.trainer import read_losses, short_run_config, train
from tests.helpers.xla_env import script_json


def modern_config(data_dir, **overrides):
    """configs/modernbert_tiny.py on conftest's packed synthetic data, short, with two of its
    four layers: the first global, the second local, as in the recipe's pattern."""
    config = short_run_config(
        modernbert_tiny,
        data_dir,
        steps=8,
        batch_size=16,
        warmup_steps=2,
        predictions=20,  # 30% of 64
        eval_every=4,
        checkpoint_every=4,
    )
    config.model.update(num_layers=2, local_attention=16)  # local layers see 8 each side of 64
    config.batch_warmup_start = 8
    config.batch_warmup_steps = 4  # 8, 8, 16, 16, ... rows
    config.optimizer.decay_steps = 0  # the rates do not depend on num_train_steps
    config.fill_mask_samples = 0
    config.update_from_flattened_dict(overrides)
    return config


@pytest.fixture(scope="module")
def modern_runs(packed_data, tmp_path_factory):
    """(straight, resumed): 8 steps in one go, and stopped at step 4 then resumed to 8."""
    root = tmp_path_factory.mktemp("modernbert")
    straight, resumed = root / "straight", root / "resumed"
    train(modern_config(packed_data[1]), straight)
    train(modern_config(packed_data[1], num_train_steps=6), resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")  # stopped mid-warmup, its last save lost
    train(modern_config(packed_data[1]), resumed)
    return straight, resumed


@pytest.mark.slow  # three short runs: about 60 s on two cores
def test_a_modernbert_run_resumes_bit_exactly_and_is_recorded_as_modernbert(modern_runs):
    straight, resumed = modern_runs
    want, got = read_losses(straight), read_losses(resumed)
    assert sorted(want) == sorted(got) == list(range(1, 9))
    for step in want:
        assert got[step] == want[step], f"step {step}: {got[step]} != {want[step]}"
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/mlm_accuracy" in r for r in records)
    assert not any(key.startswith(("train/nsp", "eval/nsp")) for r in records for key in r)

    meta = checkpoint_lib.read_meta(straight / rundir.CHECKPOINT_DIR)
    assert meta["model_config"]["family"] == "modernbert"
    config, params_straight, tokenizer = bertjax.load(straight)
    _, params_resumed, _ = bertjax.load(resumed)
    assert isinstance(config, ModernBertConfig)
    # The tokenizer trained for the run gives the config its special ids.
    assert (config.vocab_size, config.cls_token_id, config.sep_token_id) == (
        tokenizer.vocab_size,
        tokenizer.cls_id,
        tokenizer.sep_id,
    )
    for a, b in zip(jax.tree.leaves(params_straight), jax.tree.leaves(params_resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


NOTEBOOK = """
import json, sys
import numpy as np
import bertjax
from bertjax.nn import sharding

run, export = sys.argv[1], sys.argv[2]
text = "the [MASK] sees a cat."
model = bertjax.Model.load(run)
alone = model.fill_mask(text, top_k=3)
on_mesh = bertjax.Model.load(run, mesh=sharding.make_mesh((2, 2, 2))).fill_mask(text, top_k=3)
model.save_hf(export)
print(json.dumps({
    "model": repr(model),
    "alone": [[g["token"], g["score"]] for g in alone],
    "mesh": [[g["token"], g["score"]] for g in on_mesh],
}))
"""


def transformers_top_tokens(export, text: str, k: int) -> list[tuple[int, float]]:
    """The export opened by transformers: its k likeliest token ids at `text`'s [MASK]."""
    model = transformers.AutoModelForMaskedLM.from_pretrained(export).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    encoded = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits[0]
    position = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0])
    top = torch.topk(torch.softmax(logits[position], -1), k)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    return [(int(i), float(p)) for i, p in zip(top.indices, top.values)]


@pytest.mark.slow  # a fresh process with 8 devices: about 20 s
def test_a_modernbert_run_opens_in_a_fresh_process_on_a_mesh_and_in_transformers(
    modern_runs, tmp_path
):
    out = script_json(NOTEBOOK, modern_runs[0], tmp_path / "export", cwd=tmp_path)
    assert out["model"].startswith("Model(ModernBERT L2/H128/A4"), out["model"]
    # The export, opened by transformers in this process (imported here already).
    out["hf"] = transformers_top_tokens(tmp_path / "export", "the [MASK] sees a cat.", 3)
    for other in ("mesh", "hf"):
        assert [t for t, _ in out[other]] == [t for t, _ in out["alone"]], out
        np.testing.assert_allclose(
            [s for _, s in out[other]], [s for _, s in out["alone"]], rtol=1e-4, atol=1e-6
        )


@pytest.mark.slow  # data prepared at 128 and a 4-step run: about 30 s on two cores
def test_a_context_extension_phase_starts_from_the_checkpoint_and_records_it(
    modern_runs, packed_data, tmp_path
):
    phase1 = modern_runs[0]
    workdir = tmp_path / "long"
    config = modern_config(
        "",
        **{
            "init_from": str(phase1),
            "data.input": str(packed_data[0]),  # prepared again, at 128
            "data.max_seq_length": 128,
            "data.max_predictions_per_seq": 40,
            "model.global_rope_theta": 160_000.0,
            "batch_size": 8,
            "batch_warmup_start": 0,
            "batch_warmup_steps": 0,
            "num_train_steps": 4,
            "optimizer.learning_rate": 1e-3,
        },
    )
    config.data.dir = ""
    result = train(config, workdir)
    assert result["steps"] == 4 and np.isfinite(result["eval"]["eval/mlm_loss"])

    meta = checkpoint_lib.read_meta(workdir / rundir.CHECKPOINT_DIR)
    assert meta["phase"] == {
        "init_from": str(phase1),
        "step": 8,
        "changed": {"global_rope_theta": [10_000.0, 160_000.0]},
    }
    assert meta["model_config"]["global_rope_theta"] == 160_000.0
    # The data was tokenized with phase 1's tokenizer, not one trained again.
    _, _, tokenizer1 = bertjax.load(phase1)
    config2, params2, tokenizer2 = bertjax.load(workdir)
    assert tokenizer2.fingerprint == tokenizer1.fingerprint
    assert config2.global_rope_theta == 160_000.0 and config2.hidden_size == 128
    guesses = bertjax.Model(config2, params2, tokenizer2, progress=False).fill_mask(
        "the [MASK] sees a cat.", top_k=2
    )
    assert len(guesses) == 2 and 0 < guesses[0]["score"] <= 1
