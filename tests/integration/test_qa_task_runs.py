"""The integration tests of test_qa_task.py (tests/unit/), with its helpers."""

import json

import jax
import numpy as np
import pytest

from bertjax import Model
from bertjax.finetune import evaluation, loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks.qa import decode as qa_decode
from tests.helpers.qa_task import LEARNER, qa_config, random_export, write_jsonl
from tests.helpers.question_answering import synthetic_examples


@pytest.mark.slow
def test_finetune_run_learns_synthetic_squad_v2(tmp_path, optimized):
    """'the wX' over 12 random words, SQuAD v2.0 style (30% of the questions ask for a word
    not in the context and have no answer), through finetune.py's loop from a random
    BertForQuestionAnswering export: the answer is the word asked for, or none. The only
    learning test of question answering: v2.0 decoding (the null answer, null odds) is
    scored on what the run learned, and the run directory opens in Model. 6 epochs of 128
    steps, as long as the claim needs with an epoch to spare: exact match is 30.5 (always
    "no answer") through epoch 2, past the bars from epoch 4 (93.0), 100 at epoch 6."""
    rng = np.random.default_rng(0)
    train = write_jsonl(tmp_path / "train.jsonl", synthetic_examples(rng, 4096))
    dev_examples = synthetic_examples(rng, 128)
    dev = write_jsonl(tmp_path / "dev.jsonl", dev_examples)
    test = write_jsonl(tmp_path / "test.jsonl", synthetic_examples(rng, 32))
    config = qa_config(
        random_export(tmp_path / "init", LEARNER),
        train,
        dev,
        num_epochs=6,
        batch_size=32,
        eval_batch_size=64,
        log_every_steps=1000,
        **{
            "optimizer.learning_rate": 2e-3,
            "data.max_seq_length": 24,
            "data.test": test,
            "qa.doc_stride": 8,
            "qa.max_query_length": 4,
            "qa.version_2_with_negative": True,
            "model.hidden_dropout": 0.0,
            "model.attention_dropout": 0.0,
        },
    )
    settings = FinetuneSettings.from_config(config, devices=jax.devices()[:1])
    summary = loop.finetune(settings, tmp_path / "run", devices=jax.devices()[:1])
    best = summary["seeds"][0]["best"]
    scores = best["scores"]
    print(f"synthetic 'the wX' SQuAD v2.0 through loop.finetune: {scores}")
    # Always answering "no answer" scores about 30 (NoAns 100, HasAns 0); guessing a word, 8.
    assert best["metric"] == "eval/f1" and scores["eval/exact_match"] > 80.0
    assert scores["eval/HasAns_exact"] > 80.0 and scores["eval/NoAns_exact"] > 70.0
    assert scores["eval/span_accuracy"] > 0.8  # the validation windows point at the answers
    run = tmp_path / "run"
    for split, count in (("validation", 128), ("test", 32)):
        directory = run / f"predictions_{split}"
        predictions = json.loads((directory / qa_decode.PREDICTIONS_FILE).read_text())
        null_odds = json.loads((directory / qa_decode.NULL_ODDS_FILE).read_text())
        assert len(predictions) == len(null_odds) == count
    # The run directory opens as a notebook Model that answers.
    model = Model.load(run)
    example = next(e for e in dev_examples if not e.is_impossible)
    got = model.answer(example.question, example.context)
    assert got["answer"] == example.answers[0].text
    absent = next(e for e in dev_examples if e.is_impossible)
    got = model.answer(absent.question, absent.context, handle_impossible_answer=True)
    assert got["answer"] == "", got
    # Resuming a finished run takes no step and keeps the best.
    again = loop.finetune(settings, run, devices=jax.devices()[:1])
    assert again["seeds"][0]["best"]["value"] == best["value"]


@pytest.mark.slow
def test_validation_predictions_are_the_best_evaluations_without_another_pass(
    tmp_path, monkeypatch
):
    """The validation split's official files come from the best epoch's evaluation, kept
    rather than computed again: the run evaluates once per epoch and no more, and the files
    equal those a resumed finished run (which kept nothing) writes from the best checkpoint."""
    rng = np.random.default_rng(1)
    train = write_jsonl(tmp_path / "train.jsonl", synthetic_examples(rng, 64))
    dev = write_jsonl(tmp_path / "dev.jsonl", synthetic_examples(rng, 24))
    config = qa_config(
        random_export(tmp_path / "init"),
        train,
        dev,
        num_epochs=3,
        batch_size=16,
        eval_batch_size=8,
        log_every_steps=1000,
        # Large enough that a later epoch may score below an earlier one.
        **{
            "optimizer.learning_rate": 3e-2,
            "data.max_seq_length": 24,
            "qa.doc_stride": 8,
            "qa.max_query_length": 4,
        },
    )
    devices = jax.devices()[:1]
    settings = FinetuneSettings.from_config(config, devices=devices)
    passes = []
    run_eval = evaluation.run_eval
    monkeypatch.setattr(
        evaluation, "run_eval", lambda *a, **k: passes.append(1) or run_eval(*a, **k)
    )
    run = tmp_path / "run"
    summary = loop.finetune(settings, run, devices=devices)
    assert len(passes) == 3  # one per epoch, none after the last
    print(f"best epoch {summary['seeds'][0]['best']['epoch']} of 3")
    directory = run / "predictions_validation"
    names = (qa_decode.PREDICTIONS_FILE, qa_decode.NBEST_FILE)
    kept = {name: (directory / name).read_text() for name in names}

    passes.clear()
    again = loop.finetune(settings, run, devices=devices)
    assert len(passes) == 1  # resumed finished: no step, the best checkpoint predicts
    assert again["seeds"][0]["best"] == summary["seeds"][0]["best"]
    assert {name: (directory / name).read_text() for name in names} == kept
