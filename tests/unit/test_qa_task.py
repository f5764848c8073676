"""question_answering as a fine-tuning task: its settings and defaults, its splits as
windows, per-example scores and the official prediction files, Model.answer and save_hf
against transformers, and a short run through the fine-tuning loop that learns."""

import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers
from test_question_answering import CONFIG, TOKENIZER, qa_head, synthetic_examples

from bertjax import Model, hf
from bertjax.finetune import loop
from bertjax.finetune import settings as finetune_settings
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.inference import InferenceError
from bertjax.settings import ConfigError
from bertjax.tasks.qa import squad as qa
from bertjax.tasks.qa import task as qa_task
from configs import finetune as finetune_config

ATOL = 1e-4


def write_jsonl(path, examples):
    """Examples in the JSON Lines layout of transformers' datasets."""
    lines = []
    for e in examples:
        answers = {
            "text": [a.text for a in e.answers],
            "answer_start": [a.start for a in e.answers],
        }
        record = {"id": e.id, "question": e.question, "context": e.context, "answers": answers}
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def random_export(directory, config=CONFIG, seed=0):
    """A random BertForQuestionAnswering directory with the test tokenizer."""
    model = qa.QuestionAnswering(config)
    params = jax.tree.map(np.asarray, qa.init_params(model, jax.random.key(seed)))
    hf.save(config, params, directory, tokenizer=TOKENIZER, head=qa_head())
    return str(directory)


def qa_config(init_from, train, validation, **overrides):
    config = finetune_config.get_config()
    config.init_from = init_from
    config.task = "question_answering"
    config.data.train = train
    config.data.validation = validation
    for field, value in overrides.items():
        *parents, name = field.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[name] = value
    return config


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_task")
    rng = np.random.default_rng(0)
    train = write_jsonl(root / "train.jsonl", synthetic_examples(rng, 64, impossible=0.0))
    dev = write_jsonl(root / "dev.jsonl", synthetic_examples(rng, 16, impossible=0.0))
    return root, random_export(root / "init"), train, dev


def test_task_is_registered():
    task = task_lib.get("question_answering")
    assert isinstance(task, qa_task.QuestionAnsweringTask)
    assert task.default_metric == "f1" and set(task.metrics) == {"f1", "exact_match"}


def test_run_squad_defaults_apply_unless_overridden(files):
    _, init, train, dev = files
    settings = FinetuneSettings.from_config(qa_config(init, train, dev))
    assert settings.optimizer.learning_rate == 3e-5
    assert settings.run.num_epochs == 2 and settings.run.batch_size == 32
    assert settings.warmup_fraction == 0.1 and settings.run.metric == "f1"
    assert settings.data.max_seq_length == 384
    assert settings.data.task_settings == qa.QASettings()  # google's: 384, 128, 64, 20, 30, 0.0
    chosen = FinetuneSettings.from_config(
        qa_config(
            init,
            train,
            dev,
            num_epochs=5,
            **{
                "optimizer.learning_rate": 5e-5,
                "data.max_seq_length": 32,
                "qa.doc_stride": 8,
                "qa.max_query_length": 4,
            },
        )
    )
    assert chosen.optimizer.learning_rate == 5e-5 and chosen.run.num_epochs == 5
    assert (
        chosen.data.task_settings.max_seq_length == 32 and chosen.data.task_settings.doc_stride == 8
    )
    # A value given equal to another task's default is still the user's (it once was not).
    given = FinetuneSettings.from_config(
        qa_config(init, train, dev, num_epochs=3, **{"data.max_seq_length": 128})
    )
    assert given.data.max_seq_length == 128 and given.run.num_epochs == 3
    assert given.optimizer.learning_rate == 3e-5
    # Other tasks keep the generic defaults.
    config = qa_config(init, train, dev)
    config.task = "classification"
    config = finetune_settings.apply_task_defaults(config)
    assert config.optimizer.learning_rate == 2e-5 and config.data.max_seq_length == 128


def test_bad_qa_setting_names_its_field(files):
    _, init, train, dev = files
    with pytest.raises(
        ConfigError,
        match=r"^config.data.max_seq_length=16 is invalid: .*config.qa.max_query_length=64",
    ):
        FinetuneSettings.from_config(qa_config(init, train, dev, **{"data.max_seq_length": 16}))
    with pytest.raises(ConfigError, match=r"^config.qa.doc_stride=0 is invalid"):
        FinetuneSettings.from_config(qa_config(init, train, dev, **{"qa.doc_stride": 0}))
    with pytest.raises(ConfigError, match="data.validation"):
        FinetuneSettings.from_config(qa_config(init, train, "", **{"data.max_seq_length": 16}))


def read_task(files, max_seq_length=16, doc_stride=3):
    _, init, train, dev = files
    config = qa_config(
        init,
        train,
        dev,
        **{
            "data.max_seq_length": max_seq_length,
            "qa.doc_stride": doc_stride,
            "qa.max_query_length": 4,
        },
    )
    settings = FinetuneSettings.from_config(config)
    return task_lib.get("question_answering").read(settings.data, TOKENIZER)


def test_splits_are_windows_of_their_examples(files):
    data = read_task(files)
    dev = data.validation[0]
    assert len(dev.examples) == 16 and len(dev) > 16  # 12 words do not fit in one window
    assert dev.features["input_ids"].shape == (len(dev), 16)
    assert dev.indices == [dev.examples[k].id for k in dev.windows.example_index]
    assert data.head.task == "question_answering" and data.head.labels == ("start", "end")
    train = data.train
    # A training window points at the answer only when it holds it; the rest at [CLS].
    assert (train.features["start_positions"] > 0).sum() >= len(train.examples)
    assert any("64 questions" in note for note in data.notes)


def gold_logits(examples):
    """Start and end logits that put each window's maximum on the gold answer's tokens."""
    windows = examples.windows
    starts = np.zeros(windows.input_ids.shape, np.float32)
    ends = np.zeros(windows.input_ids.shape, np.float32)
    for row, k in enumerate(windows.example_index):
        answer = examples.examples[k].answers[0]
        first, last = qa.answer_token_span(
            windows.offsets[row], answer.start, answer.start + len(answer.text)
        )
        if first >= 0:
            starts[row, first] = ends[row, last] = 10.0
    return {"start_logits": starts, "end_logits": ends}


def test_scores_decode_per_example_over_windows(files):
    data = read_task(files)
    task = task_lib.get("question_answering")
    dev = data.validation[0]
    perfect = task.scores(data.head, dev, gold_logits(dev))
    assert perfect == {"exact_match": 100.0, "f1": 100.0}
    # Every window's logits the same: the first context token of the first window wins.
    flat = {k: np.zeros_like(v) for k, v in gold_logits(dev).items()}
    assert task.scores(data.head, dev, flat)["exact_match"] < 50.0


def test_write_predictions_are_the_official_files(files, tmp_path):
    data = read_task(files)
    task = task_lib.get("question_answering")
    dev = data.validation[0]
    where = task.write_predictions(
        tmp_path / "predictions_validation.tsv", data.head, dev, gold_logits(dev)
    )
    assert where == tmp_path / "predictions_validation"
    predictions = json.loads((where / qa.PREDICTIONS_FILE).read_text())
    assert predictions == {e.id: e.answers[0].text for e in dev.examples}
    nbest = json.loads((where / qa.NBEST_FILE).read_text())
    assert set(nbest) == set(predictions)
    assert set(nbest[dev.examples[0].id][0]) == {"text", "probability", "start_logit", "end_logit"}
    assert not (where / qa.NULL_ODDS_FILE).exists()  # v1.1


def test_objective_evaluates_windows(files):
    data = read_task(files)
    task = task_lib.get("question_answering")
    objective = task.objective(CONFIG, data.head)
    params = jax.tree.map(np.asarray, objective.init_params(jax.random.key(0)))
    params = nn.meta.unbox(params)
    assert set(params) == {"bert", qa.HEAD_NAME}
    batch = {k: v[:4] for k, v in data.train.features.items()}
    batch["weights"] = np.array([1, 1, 1, 0], np.float32)
    sums, outputs = objective.evaluate(params, batch)
    assert outputs["start_logits"].shape == (4, 16) == outputs["end_logits"].shape
    assert float(sums.count) == 3.0 and float(sums.loss) > 0.0


# ----------------------------------------------------------------------------- notebook


def test_model_answer_and_save_hf_match_transformers(tmp_path):
    """Model.answer on a BertForQuestionAnswering directory, then save_hf: transformers'
    logits equal ours, and the answer equals the pipeline's formula computed from
    transformers' own logits (transformers 5.x here has no question-answering pipeline)."""
    model = Model.load(random_export(tmp_path / "in", seed=3))
    assert model.head == qa_head()
    model.save_hf(tmp_path / "out")
    theirs = transformers.BertForQuestionAnswering.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    context = "w1 w2 w3 w4 w5"
    question = "the w3"
    features = qa.make_features(
        [qa.QAExample("0", question, context, ())],
        TOKENIZER,
        qa.QASettings(max_seq_length=16, doc_stride=8, max_query_length=4),
        training=False,
    )
    ours = qa.logits(model.config, model.params, features)
    with torch.no_grad():
        out = theirs(
            input_ids=torch.tensor(features.input_ids, dtype=torch.long),
            token_type_ids=torch.tensor(features.segment_ids, dtype=torch.long),
            attention_mask=torch.tensor(features.input_mask, dtype=torch.long),
        )
    mask = features.input_mask == 1
    np.testing.assert_allclose(ours[0][mask], out.start_logits.numpy()[mask], atol=ATOL)
    np.testing.assert_allclose(ours[1][mask], out.end_logits.numpy()[mask], atol=ATOL)
    # The pipeline's formula on transformers' logits: softmax over [CLS] and the context,
    # score p(start) * p(end), start <= end < start + 15.
    start, end = out.start_logits.numpy()[0], out.end_logits.numpy()[0]
    context_tokens = np.flatnonzero(features.offsets[0, :, 0] != qa.NO_OFFSET)
    keep = np.concatenate([[0], context_tokens])
    p_start = np.exp(start[keep] - start[keep].max())
    p_start /= p_start.sum()
    p_end = np.exp(end[keep] - end[keep].max())
    p_end /= p_end.sum()
    best = max(
        (p_start[i] * p_end[j], s, e)
        for i, s in enumerate(context_tokens, 1)
        for j, e in enumerate(context_tokens, 1)
        if s <= e < s + 15
    )
    got = model.answer(question, context)
    assert got["start"] == features.offsets[0, best[1], 0]
    assert got["end"] == features.offsets[0, best[2], 1]
    assert got["answer"] == context[got["start"] : got["end"]]
    assert got["score"] == pytest.approx(best[0], rel=1e-3)
    several = model.answer([question, "the w5"], context, top_k=2)
    assert len(several) == 2 and all(len(answers) == 2 for answers in several)
    first = several[0][0]
    assert (first["start"], first["end"], first["answer"]) == (
        got["start"],
        got["end"],
        got["answer"],
    )
    assert first["score"] == pytest.approx(got["score"], rel=1e-5)  # batched with another row


def test_answer_needs_a_question_answering_model(tmp_path):
    encoder_only = Model.load(random_export(tmp_path / "qa")).params["bert"]
    model = Model(CONFIG, {"bert": encoder_only}, TOKENIZER)
    assert model.head is None
    with pytest.raises(
        InferenceError,
        match=r"answer\(\) needs a fine-tuned question_answering model; .* is a "
        r"pretrained encoder: use fill_mask",
    ):
        model.answer("the w1", "w1 w2")


# ----------------------------------------------------------------------------- a run


# A model wide enough to learn the synthetic task in a few hundred steps.
LEARNER = dataclasses.replace(CONFIG, hidden_size=64, intermediate_size=128)


@pytest.mark.slow
def test_finetune_run_learns_synthetic_squad(tmp_path, optimized):
    """'the wX' over 12 random words, SQuAD v1.1 style, through finetune.py's loop from a
    random BertForQuestionAnswering export: the answer is the word asked for."""
    rng = np.random.default_rng(0)
    train = write_jsonl(tmp_path / "train.jsonl", synthetic_examples(rng, 4096, impossible=0.0))
    dev_examples = synthetic_examples(rng, 128, impossible=0.0)
    dev = write_jsonl(tmp_path / "dev.jsonl", dev_examples)
    test = write_jsonl(tmp_path / "test.jsonl", synthetic_examples(rng, 32, impossible=0.0))
    config = qa_config(
        random_export(tmp_path / "init", LEARNER),
        train,
        dev,
        num_epochs=12,
        batch_size=32,
        eval_batch_size=64,
        log_every_steps=1000,
        **{
            "optimizer.learning_rate": 2e-3,
            "data.max_seq_length": 24,
            "data.test": test,
            "qa.doc_stride": 8,
            "qa.max_query_length": 4,
            "model.hidden_dropout": 0.0,
            "model.attention_dropout": 0.0,
        },
    )
    settings = FinetuneSettings.from_config(config, devices=jax.devices()[:1])
    summary = loop.finetune(settings, tmp_path / "run", devices=jax.devices()[:1])
    best = summary["seeds"][0]["best"]
    scores = best["scores"]
    print(f"synthetic 'the wX' SQuAD v1.1 through loop.finetune: {scores}")
    # Guessing one of the 12 words scores about 8 EM.
    assert best["metric"] == "eval/f1" and scores["eval/exact_match"] > 80.0
    assert scores["eval/span_accuracy"] > 0.8  # the validation windows point at the answers
    run = tmp_path / "run"
    for split in ("validation", "test"):
        predictions = json.loads((run / f"predictions_{split}" / qa.PREDICTIONS_FILE).read_text())
        assert len(predictions) == (128 if split == "validation" else 32)
    # The run directory opens as a notebook Model that answers.
    model = Model.load(run)
    example = dev_examples[0]
    got = model.answer(example.question, example.context)
    assert got["answer"] == example.answers[0].text
    # Resuming a finished run takes no step and keeps the best.
    again = loop.finetune(settings, run, devices=jax.devices()[:1])
    assert again["seeds"][0]["best"]["value"] == best["value"]


def test_a_method_that_does_not_fit_names_the_one_that_does(tmp_path):
    model = Model.load(random_export(tmp_path / "qa"))
    with pytest.raises(
        InferenceError,
        match=r"predict\(\) needs a fine-tuned classification or regression or multi_label or "
        r"token_classification model; .* is a question_answering model: use answer\(",
    ):
        model.predict(["the w1"])
    with pytest.raises(InferenceError, match=r"generate\(\) needs a fine-tuned seq2seq model"):
        model.generate(["the w1"])
