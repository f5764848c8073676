"""The integration tests of test_seq2seq_task.py (tests/unit/), with its helpers."""

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax.engine import rundir
from bertjax.finetune import loop, prepared
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq import model as s2s
from bertjax.tasks.seq2seq import task as s2s_task
from bertjax.tasks.seq2seq.options import TaskOptions
from tests.helpers.seq2seq_task import (  # noqa: F401
    EOS,
    START,
    TEXTS,
    _batch,
    bert_config,
    exported,
    make_config,
    source,
    write_data,
)


@pytest.mark.slow  # about a minute on a shared 2-core machine
def test_objective_sums_are_the_models_loss_and_skip_padding_rows():
    options = TaskOptions(
        START,
        EOS,
        init=s2s.RND2RND,
        label_smoothing=0.1,
        max_target_length=6,
        generation=decoding.GenerationSettings(max_new_tokens=6),
    )
    config = bert_config(hidden_dropout=0.0, attention_dropout=0.0)
    objective = s2s_task.Seq2SeqObjective(config, options.head())
    params = nn.meta.unbox(jax.jit(objective.init_params)(jax.random.key(1)))
    batch = _batch(np.random.default_rng(0))
    sums = objective.sums(params, batch, rng=None, deterministic=True)
    reference = s2s.batch_loss_sums(objective.config, params, batch, label_smoothing=0.1)
    np.testing.assert_allclose(sums, reference, rtol=1e-5)
    assert float(objective.denominators(batch)) == batch["target_mask"].sum()
    # A row that only pads an evaluation batch adds nothing.
    padded = {k: np.concatenate([v, v[:1]]) for k, v in batch.items()}
    padded["weights"][-1] = 0.0
    again = objective.sums(params, padded, rng=None, deterministic=True)
    np.testing.assert_allclose(again, sums, rtol=1e-5)
    assert float(objective.denominators(padded)) == batch["target_mask"].sum()
    evaluated, outputs = objective.evaluate(params, padded)
    assert outputs["tokens"].shape == (5, options.generation.max_new_tokens)
    np.testing.assert_allclose(evaluated, sums, rtol=1e-5)


@pytest.mark.slow  # 40-50 s each on a shared 2-core machine: two models, compiles
@pytest.mark.parametrize(
    "search",
    [dict(num_beams=1), dict(num_beams=4), dict(num_beams=3, length_penalty=2.0)],
    ids=lambda s: "-".join(map(str, s.values())),
)
def test_model_generate_matches_transformers(exported, search):
    model = bertjax.Model.load(exported, batch_size=4)
    ours = model.generate(TEXTS, max_new_tokens=10, **search)
    reference = transformers.EncoderDecoderModel.from_pretrained(exported).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = reference.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            max_new_tokens=10,
            do_sample=False,
            **search,
        )
    theirs = [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
    assert ours == theirs
    assert len(set(ours)) > 1  # the inputs do not all give the same output
    assert model.generate(TEXTS[0], max_new_tokens=10, **search) == ours[0]


@pytest.mark.slow
def test_a_run_learns_to_reverse_words_and_reopens_in_a_notebook(source, tmp_path):
    """Through loop.finetune from a (random-weight) BERT directory, bert2bert: 640 examples
    of 3-5 words, 16 epochs of 20 steps (0.92 exact match at epoch 12, 1.0 from epoch 13
    measured); greedy exact match on 64 held-out examples, and beam search's in the notebook
    (1.0 measured). The only learning test of seq2seq."""
    write_data(tmp_path, 640, 64, 8)
    config = make_config(
        source,
        tmp_path,
        **{
            "batch_size": 32,
            "eval_batch_size": 64,
            "num_epochs": 16,
            "optimizer.learning_rate": 3e-3,
            "optimizer.warmup_fraction": 0.05,
            "model.hidden_dropout": 0.0,
            "model.attention_dropout": 0.0,
            "metric": "exact_match",
            "log_every_steps": 100,
        },
    )
    summary = loop.finetune(FinetuneSettings.from_config(config), tmp_path / "run")
    best = summary["seeds"][0]["best"]
    assert best["value"] >= 0.9, best
    assert best["scores"]["eval/bleu"] > 90.0, best
    workdir = tmp_path / "run"
    lines = (workdir / "predictions_test.tsv").read_text().splitlines()
    sources = (tmp_path / "test.tsv").read_text().splitlines()[1:]
    assert lines[0] == "index\tprediction" and len(lines) == 1 + len(sources)
    reversed_ = [" ".join(s.split()[::-1]) for s in sources]
    predicted = [line.split("\t")[1] for line in lines[1:]]
    assert np.mean([p == r for p, r in zip(predicted, reversed_)]) >= 0.75
    # The run directory reopens on its own, in a notebook and as the next run's init_from.
    model = bertjax.Model.load(workdir)
    assert model.generate(sources, num_beams=1, max_new_tokens=8) == predicted
    assert model.generate(sources[0], num_beams=4, max_new_tokens=8) == reversed_[0]
    # Beam search reverses the held-out sources too.
    held_out = [line.split("\t") for line in (tmp_path / "dev.tsv").read_text().splitlines()[1:]]
    beams = model.generate([s for s, _ in held_out], num_beams=4, max_new_tokens=8)
    beam_exact = np.mean([b == t for b, (_, t) in zip(beams, held_out)])
    print(f"held-out exact match: greedy {best['value']:.3f}, 4 beams {beam_exact:.3f}")
    assert beam_exact >= 0.95, beam_exact
    run = rundir.open_run(workdir)
    _, params = rundir.read_params(
        run, prepared.prepare(FinetuneSettings.from_config(config)).ft.mesh
    )
    assert set(params) == {"bert", "decoder"}
    model.save_hf(tmp_path / "export")
    reference = transformers.EncoderDecoderModel.from_pretrained(tmp_path / "export").eval()
    assert reference.config.decoder_start_token_id == START
