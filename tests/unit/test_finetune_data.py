"""Task readers (CSV, TSV, JSON Lines, CoNLL, GLUE's layout), encoding and bad-input messages."""

import json
import pathlib

import numpy as np
import pytest

from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine.settings import ConfigError
from bertjax.finetune import data, glue_tasks
from bertjax.finetune.settings import FinetuneSettings
from bertjax.finetune.task import TaskData
from bertjax.inference import Model
from bertjax.tasks.labels import data as label_data
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_config

WORDS = "the a cat dog sat ran on mat big small good bad is was not very film plot".split()
MAX_LEN = 16


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Model:
    """A tokenizer and a model config for encoding (the encoder's parameters are not used)."""
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=8,
        num_layers=1,
        num_heads=1,
        intermediate_size=8,
        max_position_embeddings=MAX_LEN,
    )
    return Model(config, {}, tokenizer, progress=False)


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def settings_for(tmp_path, **fields) -> FinetuneSettings:
    config = finetune_config.get_config()
    config.init_from = str(tmp_path)
    config.batch_size = 8
    config.eval_batch_size = 8
    config.data.max_seq_length = MAX_LEN
    config.update_from_flattened_dict(fields)
    return FinetuneSettings.from_config(config)


def load(tmp_path, encoder, **fields) -> TaskData:
    settings = settings_for(tmp_path, **fields)
    return label_data.load_task(settings.data, settings.task, encoder.tokenizer)


# ----------------------------------------------------------------------------- formats


def test_csv_sentence_pairs_are_encoded_as_the_model_encodes_them(tmp_path, encoder):
    train = write(
        tmp_path / "train.csv",
        'premise,hypothesis,label\n"the cat, the dog",a cat sat,yes\nthe mat,the dog ran,no\n',
    )
    dev = write(tmp_path / "dev.csv", "premise,hypothesis,label\nbig film,bad plot,no\n")
    task = load(
        tmp_path,
        encoder,
        task="classification",
        **{
            "data.train": str(train),
            "data.validation": str(dev),
            "data.text_fields": "premise,hypothesis",
        },
    )
    assert task.head == HeadSpec("classification", ("no", "yes"))
    features = task.train.features
    expected = encoder.encode(["the cat, the dog", "the mat"], ["a cat sat", "the dog ran"])
    width = expected["input_ids"].shape[1]
    for name in ("input_ids", "input_mask", "segment_ids"):
        assert features[name].shape == (2, MAX_LEN)
        np.testing.assert_array_equal(features[name][:, :width], expected[name])
        assert not features[name][:, width:].any()
    assert features["labels"].tolist() == [1, 0]
    assert task.validation[0].features["labels"].tolist() == [0]
    assert task.train.indices == ["0", "1"]


def test_tsv_keeps_quotes_as_text(tmp_path, encoder):
    train = write(tmp_path / "train.tsv", 'sentence\tlabel\n"the cat\t1\nthe dog\t0\n')
    task = load(
        tmp_path,
        encoder,
        task="classification",
        **{"data.train": str(train), "data.validation": str(train)},
    )
    assert len(task.train) == 2  # the quote did not swallow the next line


def test_jsonl_regression(tmp_path, encoder):
    lines = [{"text": "good film", "score": 4.5}, {"text": "bad plot", "score": "1"}]
    train = write(tmp_path / "train.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    task = load(
        tmp_path,
        encoder,
        task="regression",
        **{
            "data.train": str(train),
            "data.validation": str(train),
            "data.text_fields": "text",
            "data.label_field": "score",
        },
    )
    assert task.head.labels == ("score",)
    np.testing.assert_array_equal(task.train.features["labels"], [4.5, 1.0])


def test_multi_label_from_lists_and_from_a_separator(tmp_path, encoder):
    lines = [{"t": "good film", "tags": ["plot", "acting"]}, {"t": "bad plot", "tags": []}]
    train = write(tmp_path / "train.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    dev = write(tmp_path / "dev.csv", "t,tags\nthe film,plot|acting\nthe plot,plot\n")
    task = load(
        tmp_path,
        encoder,
        task="multi_label",
        **{
            "data.train": str(train),
            "data.validation": str(dev),
            "data.text_fields": "t",
            "data.label_field": "tags",
            "data.label_separator": "|",
        },
    )
    assert task.head.labels == ("acting", "plot")
    np.testing.assert_array_equal(task.train.features["labels"], [[1, 1], [0, 0]])
    np.testing.assert_array_equal(task.validation[0].features["labels"], [[1, 1], [0, 1]])


CONLL = """-DOCSTART- -X- -X- O

the DT B-NP O
cat NN I-NP B-ANIMAL
sat VBD B-VP O

dog NN B-NP B-ANIMAL
"""


def test_conll_words_carry_their_tags_at_their_first_sub_word(tmp_path, encoder):
    train = write(tmp_path / "train.txt", CONLL)
    test = write(tmp_path / "test.txt", "the\ndog\n\nbig\n")
    task = load(
        tmp_path,
        encoder,
        task="token_classification",
        **{"data.train": str(train), "data.validation": str(train), "data.test": str(test)},
    )
    assert task.head.labels == ("B-ANIMAL", "O")
    ignore = label_heads.IGNORE_LABEL
    assert task.train.features["labels"][0, :5].tolist() == [ignore, 1, 0, 1, ignore]
    assert [w.tolist() for w in task.train.word_positions] == [[1, 2, 3], [1]]
    assert [w.tolist() for w in task.train.word_labels] == [[1, 0, 1], [0]]
    assert not task.test[0].has_labels
    assert (task.test[0].features["labels"] == ignore).all()
    assert task.train.indices == ["0", "1"]


# ----------------------------------------------------------------------------- GLUE


def glue_dir(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        write(root / name, text)
    return root


def test_glue_cola_reads_headerless_train_and_dev_and_a_headed_test(tmp_path, encoder):
    directory = glue_dir(
        tmp_path / "CoLA",
        {
            "train.tsv": "gj04\t1\t\tthe cat sat .\ngj04\t0\t*\tcat the sat .\n",
            "dev.tsv": "gj04\t0\t*\tsat the cat .\n",
            "test.tsv": "index\tsentence\n0\tthe dog ran .\n1\ta dog sat .\n",
        },
    )
    task = load(tmp_path, encoder, **{"data.glue_task": "CoLA", "data.dir": str(directory)})
    assert task.head == HeadSpec("classification", ("0", "1"))
    assert task.train.features["labels"].tolist() == [1, 0]
    assert [e.name for e in task.validation] == ["validation"]
    assert task.test[0].indices == ["0", "1"] and not task.test[0].has_labels
    assert (
        settings_for(tmp_path, **{"data.glue_task": "cola", "data.dir": str(directory)}).run.metric
        == "mcc"
    )


MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
)


def mnli_row(index: int, a: str, b: str, label: str) -> str:
    return (
        f"{index}\t1\t1a\tfiction\t( a )\t( b )\t(ROOT a)\t(ROOT b)\t{a}\t{b}\t{label}\t{label}\n"
    )


def test_glue_mnli_has_matched_and_mismatched_validation_and_test(tmp_path, encoder):
    test_header = MNLI_HEADER.replace("\tlabel1\tgold_label", "")
    directory = glue_dir(
        tmp_path / "MNLI",
        {
            "train.tsv": MNLI_HEADER
            + mnli_row(0, "the cat sat", "a cat sat", "entailment")
            + mnli_row(1, "the cat sat", "the cat ran", "contradiction"),
            "dev_matched.tsv": MNLI_HEADER + mnli_row(5, "the dog", "a dog", "neutral"),
            "dev_mismatched.tsv": MNLI_HEADER + mnli_row(6, "the mat", "a mat", "entailment"),
            "test_matched.tsv": test_header + "17\t1\t1a\tx\t(a)\t(b)\t(a)\t(b)\tthe dog\ta cat\n",
        },
    )
    task = load(tmp_path, encoder, **{"data.glue_task": "mnli", "data.dir": str(directory)})
    assert task.head.labels == ("contradiction", "entailment", "neutral")
    assert task.train.features["labels"].tolist() == [1, 0]
    assert [e.name for e in task.validation] == ["validation_matched", "validation_mismatched"]
    assert task.validation[0].features["labels"].tolist() == [2]
    assert [e.name for e in task.test] == ["test_matched"]  # the mismatched test is absent
    assert task.test[0].indices == ["17"]
    np.testing.assert_array_equal(
        task.train.features["segment_ids"][0, :8], [0, 0, 0, 0, 0, 1, 1, 1]
    )


def test_glue_stsb_is_regression_and_mrpc_reads_its_own_columns(tmp_path, encoder):
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    stsb = glue_dir(
        tmp_path / "STS-B",
        {
            "train.tsv": header + "0\tnews\tf\t2012\t1\tnone\tnone\tthe cat\ta cat\t4.25\n",
            "dev.tsv": header + "0\tnews\tf\t2012\t1\tnone\tnone\tthe dog\ta mat\t0.5\n",
        },
    )
    task = load(tmp_path, encoder, **{"data.glue_task": "sts-b", "data.dir": str(stsb)})
    assert task.head.task == "regression"
    np.testing.assert_array_equal(task.train.features["labels"], [4.25])
    mrpc_header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    mrpc = glue_dir(
        tmp_path / "MRPC",
        {
            "train.tsv": mrpc_header + "1\t1\t2\tthe cat sat\ta cat sat\n0\t3\t4\tthe\tdog\n",
            "dev.tsv": mrpc_header + "0\t5\t6\tthe film\tthe plot\n",
        },
    )
    task = load(tmp_path, encoder, **{"data.glue_task": "mrpc", "data.dir": str(mrpc)})
    assert task.train.features["labels"].tolist() == [1, 0]
    assert (
        settings_for(tmp_path, **{"data.glue_task": "mrpc", "data.dir": str(mrpc)}).run.metric
        == "f1"
    )


def test_glue_qqp_skips_its_malformed_rows_and_says_so(tmp_path, encoder):
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
    qqp = glue_dir(
        tmp_path / "QQP",
        {
            "train.tsv": header
            + "0\t1\t2\tthe cat\ta cat\t1\n1\t3\t4\tthe dog\n2\t5\t6\tthe\ta\t0\n",
            "dev.tsv": header + "0\t1\t2\tthe mat\ta mat\t1\n",
        },
    )
    task = load(tmp_path, encoder, **{"data.glue_task": "qqp", "data.dir": str(qqp)})
    assert len(task.train) == 2
    assert any("skipped 1 malformed row" in note for note in task.notes)


def test_a_glue_directory_without_its_files_is_named(tmp_path):
    (tmp_path / "RTE").mkdir()
    with pytest.raises(ConfigError, match=r"config.data.dir=.*has no train.tsv"):
        settings_for(tmp_path, **{"data.glue_task": "rte", "data.dir": str(tmp_path / "RTE")})
    with pytest.raises(ConfigError, match=r"config.task='classification': GLUE's stsb"):
        settings_for(
            tmp_path,
            task="classification",
            **{"data.glue_task": "stsb", "data.dir": str(tmp_path / "RTE")},
        )


# ----------------------------------------------------------------------------- bad input


def files(tmp_path, train: str, dev: str, name: str = "x.csv") -> dict:
    return {
        "task": "classification",
        "data.train": str(write(tmp_path / f"train_{name}", train)),
        "data.validation": str(write(tmp_path / f"dev_{name}", dev)),
    }


@pytest.mark.parametrize(
    "train, dev, message",
    [
        (
            "sentence,label\nthe cat,a\nthe dog,b\n",
            "sentence,label\nthe mat,a\nthe film,c\n",
            r"dev_x.csv line 3: label 'c' never appears in the training data .*train_x.csv "
            r"\(its labels: a, b\)",
        ),
        (
            "text,label\nthe cat,a\n",
            "text,label\n",
            r"train_x.csv line 1: no text column 'sentence'; the header has \['text', 'label'\]",
        ),
        ("", "sentence,label\nthe,a\n", r"train_x.csv is empty"),
        ("sentence,label\n", "sentence,label\nthe,a\n", r"train_x.csv holds no examples"),
        (
            "sentence,label\nthe cat,a\n ,b\n",
            "sentence,label\nthe,a\n",
            r"train_x.csv line 3: the text in 'sentence' is empty",
        ),
        (
            "sentence,label\nthe cat,a\nthe dog,b\n",
            "sentence\nthe mat\n",
            r"dev_x.csv: no label column 'label'; validation data needs labels",
        ),
        (
            "sentence,label\nthe cat,a\nthe dog\n",
            "sentence,label\nthe,a\n",
            r"train_x.csv line 3: 1 field\(s\), but column 'label' is field 2",
        ),
        (
            "sentence,label\nthe cat,a\nthe dog,a\n",
            "sentence,label\nthe,a\n",
            r"train_x.csv: a classification head needs at least 2 labels",
        ),
    ],
)
def test_bad_input_is_named_by_file_and_line(tmp_path, encoder, train, dev, message):
    with pytest.raises(data.TaskDataError, match=message):
        load(tmp_path, encoder, **files(tmp_path, train, dev))


def test_bad_jsonl_and_conll_lines_are_named(tmp_path, encoder):
    bad_json = files(
        tmp_path, '{"sentence": "the", "label": "a"}\n{"sentence": "x"\n', "", "j.jsonl"
    )
    bad_json["data.validation"] = bad_json["data.train"]
    with pytest.raises(data.TaskDataError, match=r"train_j.jsonl line 2: not a JSON object"):
        load(tmp_path, encoder, **bad_json)
    regression = {
        **bad_json,
        "task": "regression",
        "data.train": str(write(tmp_path / "r.jsonl", '{"sentence": "the", "label": "high"}\n')),
    }
    with pytest.raises(
        data.TaskDataError, match=r"r.jsonl line 1: label 'high' in field 'label' is not a finite"
    ):
        load(tmp_path, encoder, **regression)
    conll = str(write(tmp_path / "t.conll", "the O\ncat\n"))
    with pytest.raises(data.TaskDataError, match=r"t.conll line 2: no tag after tagged lines"):
        load(
            tmp_path,
            encoder,
            task="token_classification",
            **{"data.train": conll, "data.validation": conll},
        )


def test_a_token_file_for_a_sentence_task_is_refused_at_the_config(tmp_path):
    conll = str(write(tmp_path / "t.conll", "the O\n"))
    with pytest.raises(ConfigError, match=r"config.data.train=.*CoNLL files are for token_"):
        settings_for(
            tmp_path, task="classification", **{"data.train": conll, "data.validation": conll}
        )


def test_the_glue_table_knows_every_task():
    assert set(glue_tasks.GLUE_TASKS) == {
        "cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"
    }  # fmt: skip
    assert glue_tasks.glue_task("SST-2") is glue_tasks.GLUE_TASKS["sst2"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("token_capacity", 1.5, r"config.token_capacity=1.5: .*\[0, 1\]"),
        ("length_bucket", -8, r"config.length_bucket=-8: .*integer >= 0"),
    ],
)
def test_packing_and_bucket_settings_are_checked(tmp_path, field, value, message):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\nhello,a\n", encoding="utf-8")
    fields = {"task": "classification", "data.train": str(train), "data.validation": str(train)}
    fields[field] = value
    with pytest.raises(ConfigError, match=message):
        settings_for(tmp_path, **fields)


def test_glue_tasks_name_registered_label_tasks():
    # The GLUE table sits below the task packages and names their tasks by string.
    assert {glue.task for glue in glue_tasks.GLUE_TASKS.values()} == {
        label_heads.CLASSIFICATION,
        label_heads.REGRESSION,
    }
