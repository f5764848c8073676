"""question_answering as a fine-tuning task: its settings and defaults, its splits as
windows, per-example scores and the official prediction files, Model.answer and save_hf
against transformers, and a short run through the fine-tuning loop that learns."""

import importlib
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import Model
from bertjax.engine.settings import ConfigError
from bertjax.finetune import settings as finetune_settings
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.inference import InferenceError, batching
from bertjax.tasks.qa import decode as qa_decode
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad as qa
from bertjax.tasks.qa import task as qa_task
from tests.helpers.qa_task import qa_config, random_export, write_jsonl
from tests.helpers.question_answering import CONFIG, TOKENIZER, synthetic_examples

# The module (the package's `answer` is its function).
answer_lib = importlib.import_module("bertjax.tasks.qa.answer")


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
    predictions = json.loads((where / qa_decode.PREDICTIONS_FILE).read_text())
    assert predictions == {e.id: e.answers[0].text for e in dev.examples}
    nbest = json.loads((where / qa_decode.NBEST_FILE).read_text())
    assert set(nbest) == set(predictions)
    assert set(nbest[dev.examples[0].id][0]) == {"text", "probability", "start_logit", "end_logit"}
    assert not (where / qa_decode.NULL_ODDS_FILE).exists()  # v1.1


def test_objective_evaluates_windows(files):
    data = read_task(files)
    task = task_lib.get("question_answering")
    objective = task.objective(CONFIG, data.head)
    params = jax.tree.map(np.asarray, jax.jit(objective.init_params)(jax.random.key(0)))
    params = nn.meta.unbox(params)
    assert set(params) == {"bert", qa_model.HEAD_NAME}
    batch = {k: v[:4] for k, v in data.train.features.items()}
    batch["weights"] = np.array([1, 1, 1, 0], np.float32)
    sums, outputs = objective.evaluate(params, batch)
    assert outputs["start_logits"].shape == (4, 16) == outputs["end_logits"].shape
    assert float(sums.count) == 3.0 and float(sums.loss) > 0.0


# ----------------------------------------------------------------------------- notebook


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


def test_answer_pads_windows_to_their_width_not_to_the_next_power_of_two(tmp_path, monkeypatch):
    # Windows of 24 tokens run in a 24-wide bucket (real SQuAD: 384, not 512); the answer is
    # the one windows padded to 32 give.
    model = Model.load(random_export(tmp_path / "qa"))
    context = " ".join(f"w{i % 12}" for i in range(60))
    widths = []
    logits = answer_lib._logits

    def spy(params, batch, *, config, packed_length):
        widths.append(batch["input_ids"].shape[1])
        return logits(params, batch, config=config, packed_length=packed_length)

    monkeypatch.setattr(answer_lib, "_logits", spy)
    got = model.answer("the w3", context, max_seq_len=24, doc_stride=8, top_k=3)
    assert widths and set(widths) == {24}
    bucket = batching.Batcher.bucket
    monkeypatch.setattr(batching.Batcher, "bucket", lambda self, rows, f, _: bucket(self, rows, f))
    widths.clear()
    padded = model.answer("the w3", context, max_seq_len=24, doc_stride=8, top_k=3)
    assert set(widths) == {32}
    # The same spans; scores within float rounding (padding changes the matmuls' shapes).
    assert [{**a, "score": 0} for a in padded] == [{**a, "score": 0} for a in got]
    assert [a["score"] for a in padded] == pytest.approx([a["score"] for a in got], rel=1e-5)


# ----------------------------------------------------------------------------- a run


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
