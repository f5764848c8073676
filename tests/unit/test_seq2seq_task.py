"""The seq2seq fine-tuning task: settings, files, the objective, warm starts, scores, the
notebook's Model.generate and export beside transformers, and a run that learns to reverse
words."""

import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest
import sacrebleu

import bertjax
from bertjax import rundir
from bertjax.encoders.bert import transformers as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.settings import ConfigError
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from bertjax.tasks.seq2seq import model as s2s
from bertjax.tasks.seq2seq import task as s2s_task
from bertjax.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_config

WORDS = [f"w{i}" for i in range(27)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
START, EOS = 2, 3


def bert_config(**fields) -> BertConfig:
    return BertConfig(
        **{
            "vocab_size": len(SPECIAL) + len(WORDS),
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 16,
            **fields,
        }
    )


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> pathlib.Path:
    """A transformers BERT directory (random BertForPreTraining weights) with a WordPiece
    vocabulary of [PAD] [UNK] [CLS] [SEP] [MASK] w0..w26: the model to fine-tune."""
    root = tmp_path_factory.mktemp("source")
    (root / "vocab.txt").write_text("\n".join([*SPECIAL, *WORDS]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(root / "vocab.txt")
    config = bert_config()
    ids = np.zeros((1, 4), np.int32)
    params = BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids)["params"]
    bert_hf.save(config, nn.meta.unbox(params), root / "model", tokenizer)
    return root / "model"


def reversals(rng, count: int, labelled: bool = True) -> list[str]:
    """TSV lines: 3 to 5 words, and (labelled) the same words reversed."""
    lines = ["source\ttarget" if labelled else "source"]
    for _ in range(count):
        words = list(rng.choice(WORDS, size=rng.integers(3, 6)))
        lines.append(" ".join(words) + ("\t" + " ".join(words[::-1]) if labelled else ""))
    return lines


def write_data(directory: pathlib.Path, train: int, validation: int, test: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for name, count, labelled in (
        ("train.tsv", train, True),
        ("dev.tsv", validation, True),
        ("test.tsv", test, False),
    ):
        (directory / name).write_text("\n".join(reversals(rng, count, labelled)) + "\n")


def make_config(source: pathlib.Path, data: pathlib.Path, **fields):
    config = finetune_config.get_config()
    config.init_from = str(source)
    config.task = "seq2seq"
    config.data.train = str(data / "train.tsv")
    config.data.validation = str(data / "dev.tsv")
    config.data.test = str(data / "test.tsv")
    config.data.max_seq_length = 8
    config.data.max_target_length = 8
    config.batch_size = 8
    config.eval_batch_size = 8
    for dotted, value in fields.items():
        *parents, last = dotted.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[last] = value
    return config


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
    options = s2s.TaskOptions.from_head(bertjax.HeadSpec.from_dict(data.head.to_dict()))
    assert (options.init, options.decoder_start_id, options.eos_id) == ("bert2bert", START, EOS)
    assert options.max_target_length == 6


# ------------------------------------------------------------------------------ objective


def _batch(rng, rows=4):
    ids = np.zeros((rows, 8), np.int32)
    targets = []
    for i in range(rows):
        words = rng.integers(5, 32, size=rng.integers(2, 5))
        ids[i, : len(words) + 2] = [START, *words, EOS]
        targets.append(words[::-1].tolist())
    batch = dict(
        input_ids=ids,
        input_mask=(ids > 0).astype(np.int32),
        segment_ids=np.zeros_like(ids),
        **s2s.target_features(targets, 6, START, EOS),
    )
    batch["weights"] = np.ones(rows, np.float32)
    return batch


def test_a_decoder_longer_than_the_positions_is_refused():
    options = s2s.TaskOptions(START, EOS, max_target_length=20)
    with pytest.raises(ConfigError, match="config.data.max_target_length=20: exceeds"):
        s2s_task.Seq2SeqObjective(bert_config(), options.head())
    options = s2s.TaskOptions(START, EOS, max_target_length=8)  # generates 64 by default
    with pytest.raises(ConfigError, match=r"config.seq2seq.max_new_tokens=64: needs 65 dec"):
        s2s_task.Seq2SeqObjective(bert_config(), options.head())


@pytest.mark.parametrize("init", s2s.INITS)
def test_warm_start_takes_what_each_init_says(source, init):
    run = rundir.open_run(source)
    options = s2s.TaskOptions(
        START, EOS, init=init, max_target_length=8, generation=s2s.GenerationSettings(8)
    )
    objective = s2s_task.Seq2SeqObjective(run.config, options.head())
    fresh = nn.meta.unbox(objective.init_params(jax.random.key(3)))
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


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A transformers EncoderDecoderModel directory of random weights, written by bertjax,
    with the tokenizer; initializer_range 0.2 so that outputs vary by input."""
    run_dir = tmp_path_factory.mktemp("vocab")
    (run_dir / "vocab.txt").write_text("\n".join([*SPECIAL, *WORDS]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(run_dir / "vocab.txt")
    config = s2s.Seq2SeqConfig(
        bert_config(initializer_range=0.2, max_position_embeddings=24), START, EOS, s2s.RND2RND
    )
    params = nn.meta.unbox(s2s.init_params(config, jax.random.key(5)))
    directory = run_dir / "export"
    seq2seq_hf.save_seq2seq(config, params, directory, tokenizer)
    return directory


TEXTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9 w10", "w11", "w3 w3 w12 w20"]


def test_generate_needs_an_encoder_decoder(source):
    with pytest.raises(
        bertjax.inference.InferenceError,
        match=r"generate\(\) needs a fine-tuned seq2seq model; .* use fill_mask",
    ):
        bertjax.Model.load(source).generate(["w1"])


# ------------------------------------------------------------------------------ slow: a run
