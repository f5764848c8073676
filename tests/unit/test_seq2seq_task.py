"""The seq2seq fine-tuning task: settings, files, the objective, warm starts, scores, the
notebook's Model.generate and export beside transformers, and a run that learns to reverse
words."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import sacrebleu

import bertjax
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq import model as s2s
from bertjax.tasks.seq2seq import task as s2s_task
from bertjax.tasks.seq2seq.options import TaskOptions
from tests.helpers.seq2seq_task import (  # noqa: F401
    EOS,
    START,
    WORDS,
    bert_config,
    make_config,
    source,
    write_data,
)

# ------------------------------------------------------------------------------ settings, data


def test_the_task_is_registered_with_its_metrics():
    task = task_lib.get("seq2seq")
    assert task.metrics == ("bleu", "rouge1", "rouge2", "rougeL", "exact_match")
    assert task.default_metric == "bleu"


def test_settings_read_the_task_fields(source, tmp_path):
    write_data(tmp_path, 16, 8, 4)
    settings = FinetuneSettings.from_config(
        make_config(
            source,
            tmp_path,
            **{
                "data.max_source_length": 10,
                "seq2seq.num_beams": 3,
                "seq2seq.init": "bertshare",
                "seq2seq.label_smoothing": 0.1,
            },
        )
    )
    options = settings.data.task_options
    assert settings.run.metric == "bleu"
    assert settings.data.max_seq_length == 10  # the source's positions
    assert (options.source_field, options.target_field, options.init) == (
        "source",
        "target",
        "bertshare",
    )
    assert options.generation.num_beams == 3
    assert options.generation.max_new_tokens == 8  # max_target_length when 0
    assert options.label_smoothing == 0.1


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("data.source_field", "", r"config.data.source_field='': must name the field"),
        ("data.target_field", "source", r"config.data.target_field='source': must differ"),
        ("data.max_target_length", 1, r"config.data.max_target_length=1: must be an int >= 2"),
        ("data.max_source_length", 2, r"config.data.max_source_length=2: must be an int >= 3"),
        ("seq2seq.init", "bert", r"config.seq2seq.init='bert': must be one of \('bert2bert'"),
        ("seq2seq.label_smoothing", 1.0, r"config.seq2seq.label_smoothing=1.0: must be in"),
        ("seq2seq.num_beams", 0, r"config.seq2seq.num_beams=0: must be an int >= 1"),
        ("metric", "accuracy", r"config.metric='accuracy': must be one of \('bleu'"),
    ],
)
def test_bad_settings_fail_in_one_line_naming_the_field(source, tmp_path, field, value, message):
    write_data(tmp_path, 16, 8, 4)
    with pytest.raises(ConfigError, match=message) as caught:
        FinetuneSettings.from_config(make_config(source, tmp_path, **{field: value}))
    assert "\n" not in str(caught.value)


def test_files_become_sources_and_shifted_targets(source, tmp_path):
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"src": "w1 w2 w3 w4 w5 w6 w7 w8", "tgt": "w3 w2 w1 w0 w4 w5 w6 w7 w8"})
        + "\n"
        + json.dumps({"src": "w5", "tgt": "w6 w7"})
        + "\n"
    )
    (tmp_path / "test.jsonl").write_text(json.dumps({"src": "w9 w10"}) + "\n")
    config = make_config(
        source,
        tmp_path,
        **{
            "data.train": str(tmp_path / "train.jsonl"),
            "data.validation": str(tmp_path / "train.jsonl"),
            "data.test": str(tmp_path / "test.jsonl"),
            "data.source_field": "src",
            "data.target_field": "tgt",
            "data.max_target_length": 6,
        },
    )
    settings = FinetuneSettings.from_config(config)
    tokenizer = rundir.open_run(source).tokenizer
    data = task_lib.get("seq2seq").read(settings.data, tokenizer)
    train = data.train.features
    w = {word: tokenizer.encode_batch([word])[0][0] for word in WORDS}
    assert train["input_ids"].shape == (2, 8)
    assert train["input_ids"][1].tolist() == [START, w["w5"], EOS, 0, 0, 0, 0, 0]
    assert train["input_ids"][0, -1] == EOS  # cut to max_source_length, [SEP] kept
    assert train["target_ids"][1].tolist() == [w["w6"], w["w7"], EOS, 0, 0, 0]
    assert train["decoder_input_ids"][1].tolist() == [START, w["w6"], w["w7"], EOS, 0, 0]
    assert train["target_mask"][1].tolist() == [1, 1, 1, 0, 0, 0]
    # A target longer than max_target_length keeps room for [SEP].
    assert train["target_ids"][0].tolist()[-1] == EOS and train["target_mask"][0].all()
    assert data.train.targets == ("w3 w2 w1 w0 w4 w5 w6 w7 w8", "w6 w7")
    assert any("1 of 2 target(s) are longer" in note for note in data.notes)
    test = data.test[0]
    assert not test.has_labels and test.features["target_mask"].sum() == 0
    # The head holds what reopens the run: init, special ids, loss and generation.
    options = TaskOptions.from_head(bertjax.HeadSpec.from_dict(data.head.to_dict()))
    assert (options.init, options.decoder_start_id, options.eos_id) == ("bert2bert", START, EOS)
    assert options.max_target_length == 6


# ------------------------------------------------------------------------------ objective


def test_a_decoder_longer_than_the_positions_is_refused():
    options = TaskOptions(START, EOS, max_target_length=20)
    with pytest.raises(ConfigError, match="config.data.max_target_length=20: exceeds"):
        s2s_task.Seq2SeqObjective(bert_config(), options.head())
    options = TaskOptions(START, EOS, max_target_length=8)  # generates 64 by default
    with pytest.raises(ConfigError, match=r"config.seq2seq.max_new_tokens=64: needs 65 dec"):
        s2s_task.Seq2SeqObjective(bert_config(), options.head())


@pytest.mark.parametrize("init", s2s.INITS)
def test_warm_start_takes_what_each_init_says(source, init):
    run = rundir.open_run(source)
    options = TaskOptions(
        START, EOS, init=init, max_target_length=8, generation=decoding.GenerationSettings(8)
    )
    objective = s2s_task.Seq2SeqObjective(run.config, options.head())
    fresh = nn.meta.unbox(jax.jit(objective.init_params)(jax.random.key(3)))
    params, note = s2s_task.warm_start(options, run.config, run, run.params, fresh)
    assert init in note
    assert jax.tree.structure(params) == jax.tree.structure(fresh)
    pretrained = run.params["bert"]
    query = ("attention", "query", "kernel")

    def leaf(tree, *path):
        for key in path:
            tree = tree[key]
        return np.asarray(tree)

    encoder_query = leaf(params["bert"], "encoder", "layer_0", *query)
    assert np.array_equal(encoder_query, leaf(pretrained, "encoder", "layer_0", *query)) == (
        init != s2s.RND2RND
    )
    decoder_query = ("decoder", "layer_0", *query)
    if init == s2s.BERT2BERT:
        np.testing.assert_array_equal(leaf(params, *decoder_query), encoder_query)
    elif init == s2s.BERTSHARE:  # stored once, under the encoder
        assert "attention" not in params["decoder"]["layer_0"]
    else:
        np.testing.assert_array_equal(leaf(params, *decoder_query), leaf(fresh, *decoder_query))
    cross = ("decoder", "layer_0", "cross_attention", "query", "kernel")
    np.testing.assert_array_equal(leaf(params, *cross), leaf(fresh, *cross))  # always new


def test_scores_and_predictions_from_generated_ids(source, tmp_path):
    tokenizer = rundir.open_run(source).tokenizer
    ids = [tokenizer.encode_batch([t])[0] for t in ("w1 w2 w3", "w4 w5")]
    features = s2s.target_features(ids, 6, START, EOS)
    examples = s2s_task.Seq2SeqExamples(
        name="validation",
        path="dev.tsv",
        features=features,
        indices=["a", "b"],
        has_labels=True,
        targets=("w1 w2 w3", "w4 w5"),
        tokenizer=tokenizer,
    )
    # Row a generated exactly; row b one word wrong and then [SEP], with padding after.
    tokens = np.zeros((2, 6), np.int32)
    tokens[0, :4] = [*ids[0], EOS]
    tokens[1, :3] = [ids[1][0], ids[0][0], EOS]
    outputs = {"tokens": tokens, "lengths": np.array([4, 3], np.int32)}
    scores = s2s_task.split_scores(examples, outputs)
    assert scores["exact_match"] == 0.5
    assert scores["rouge1"] == pytest.approx((1.0 + 0.5) / 2)
    # BLEU of the decoded texts against the targets as written (no 4-gram matches: 0).
    expected = sacrebleu.corpus_bleu(["w1 w2 w3", "w4 w1"], [["w1 w2 w3", "w4 w5"]]).score
    assert scores["bleu"] == pytest.approx(expected)
    path = tmp_path / "predictions.tsv"
    task_lib.get("seq2seq").write_predictions(path, None, examples, outputs)
    assert path.read_text().splitlines() == ["index\tprediction", "a\tw1 w2 w3", "b\tw4 w1"]


# ------------------------------------------------------------------------------ the notebook


def test_generate_needs_an_encoder_decoder(source):
    with pytest.raises(
        bertjax.inference.InferenceError,
        match=r"generate\(\) needs a fine-tuned seq2seq model; .* use fill_mask",
    ):
        bertjax.Model.load(source).generate(["w1"])


# ------------------------------------------------------------------------------ slow: a run
