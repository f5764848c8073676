"""Bad and odd input to the question-answering, seq2seq and embedding tasks and to the notebook
methods: each fault is refused in one line naming the file and line (or record) and the
field, or the argument, before a tokenizer or a compiled function sees it."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from bertjax import Model
from bertjax import capability as capability_lib
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine.settings import ConfigError
from bertjax.finetune import data as task_data
from bertjax.finetune import layouts
from bertjax.finetune import task as task_lib
from bertjax.finetune.data import TaskDataError
from bertjax.finetune.settings import FinetuneDataSettings, FinetuneSettings
from bertjax.inference import InferenceError
from bertjax.tasks.embed import task as embed_task
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.labels import data as label_data
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad as qa
from bertjax.tasks.qa import task as qa_task
from bertjax.tasks.seq2seq import model as s2s
from bertjax.tasks.seq2seq.options import TaskOptions
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.seq2seq_task import bert_config, make_config, source, write_data  # noqa: F401

WORDS = [f"w{i}" for i in range(40)]
TOKENIZER = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
CONFIG = dataclasses.replace(
    SMALL_BERT,
    vocab_size=len(WORDS) + 5,
    num_layers=1,
    intermediate_size=48,
    max_position_embeddings=32,
)
QA_SETTINGS = qa.QASettings(max_seq_length=16, doc_stride=4, max_query_length=4)
GOOD = {"id": "a", "question": "w1 w2", "context": "w3 w4 w5", "answers": {}}


def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


def jsonl(*records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def answered(qid: str, **fields) -> dict:
    record = {
        "id": qid,
        "question": "w1 w2",
        "context": "w3 w4 w5",
        "answers": {"text": ["w4"], "answer_start": [3]},
    }
    return {**record, **fields}


# ------------------------------------------------------------------------------ SQuAD files


def test_squad_json_lines_end_at_newline_only(tmp_path):
    # U+2028 and U+2029 are legal inside a JSON string; str.splitlines() would cut there.
    path = tmp_path / "train.jsonl"
    records = [answered(f"q{k}") for k in range(6)]
    records.append(answered("q6", question="w1\u2028w2", context="w3 w4\u2029 w5"))
    path.write_text(jsonl(*records), encoding="utf-8")
    data = qa.read_examples(path)
    assert [e.id for e in data.examples][-1] == "q6"
    assert data.examples[-1].question == "w1\u2028w2"


def test_squad_crlf_and_byte_order_mark_are_read(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + jsonl(answered("a"), answered("b")).replace("\n", "\r\n").encode()
    )
    assert [e.id for e in qa.read_examples(path).examples] == ["a", "b"]


@pytest.mark.parametrize("name", ["train.jsonl", "train.json"])
def test_squad_bytes_that_are_not_utf8_name_file_line_and_column(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        text = jsonl(answered("a"), answered("b", context="caf\u00e9 w4 w5"))
    else:
        squad = {"data": [{"paragraphs": [{"context": "caf\u00e9", "qas": []}]}]}
        text = json.dumps(squad, indent=1, ensure_ascii=False)
    path.write_bytes(text.encode("utf-8").replace("\u00e9".encode(), b"\xe9"))
    with pytest.raises(ValueError) as err:
        qa.read_examples(path)
    line = 2 if name.endswith(".jsonl") else 6
    assert f"{name} line {line}: byte 0xe9 at column" in one_line(err)


def test_squad_json_syntax_error_names_line_and_column(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text('{\n  "data": [\n    {"paragraphs": []\n')
    with pytest.raises(ValueError, match=r"dev\.json line 4: not valid JSON \(.* at column 1\)"):
        qa.read_examples(path)


@pytest.mark.parametrize(
    "record, message",
    [
        (answered("b", question=""), r"x\.jsonl line 2: question '' is empty"),
        (answered("b", question="  "), r"x\.jsonl line 2: question '  ' is empty"),
        (answered("b", context="\t"), r"x\.jsonl line 2: context '\\t' is empty"),
        (answered("b", question=7), r"x\.jsonl line 2: question=7 must be a str"),
        (answered("b", id=[1]), r"x\.jsonl line 2: id=\[1\] must be a str or int"),
        ([1, 2], r"x\.jsonl line 2: a JSON list, not an object"),
        ({"id": "b", "question": "w1", "context": "w2"}, r"x\.jsonl line 2: missing 'answers'"),
    ],
)
def test_squad_json_lines_faults_name_line_and_field(tmp_path, record, message):
    path = tmp_path / "x.jsonl"
    path.write_text(jsonl(answered("a"), record))
    with pytest.raises(ValueError, match=message) as err:
        qa.read_examples(path)
    one_line(err)


def test_squad_json_empty_question_names_the_record(tmp_path):
    qas = [
        {"id": "a", "question": "w1", "answers": [{"text": "w3", "answer_start": 0}]},
        {"id": "b", "question": "", "answers": [{"text": "w3", "answer_start": 0}]},
    ]
    squad = {"data": [{"paragraphs": [{"context": "w3 w4", "qas": qas}]}]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(squad))
    with pytest.raises(ValueError) as err:
        qa.read_examples(path)
    assert "train.json: data[0].paragraphs[0].qas[1]: question '' is empty" in one_line(err)


def test_a_squad_test_file_may_lack_answers(tmp_path):
    squad = {
        "data": [{"paragraphs": [{"context": "w3 w4", "qas": [{"id": "a", "question": "w1"}]}]}]
    }
    path = tmp_path / "test.json"
    path.write_text(json.dumps(squad))
    with pytest.raises(ValueError, match=r"qas\[0\]: missing 'answers'"):
        qa.read_examples(path)
    data = qa.read_examples(path, answers_required=False)
    assert not data.has_answers and not data.version_2 and data.mismatched == ()
    assert data.examples[0].answers == () and not data.examples[0].is_impossible
    assert "without answers" in data.report()

    lines = tmp_path / "test.jsonl"
    lines.write_text(jsonl({"id": "a", "question": "w1", "context": "w3 w4"}))
    split, read = qa_task.encode_split(
        "test", str(lines), TOKENIZER, QA_SETTINGS, training=False, version_2=True
    )
    assert not split.has_labels and read.version_2 and len(split) == 1


def test_a_squad_test_file_gives_answers_to_all_questions_or_none(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(jsonl(answered("a"), {"id": "b", "question": "w1", "context": "w3"}))
    with pytest.raises(ValueError) as err:
        qa.read_examples(path, answers_required=False)
    message = one_line(err)
    assert "test.jsonl line 2: lacks 'answers', unlike " in message
    assert "test.jsonl line 1; give every question answers, or none" in message


def test_a_question_answering_run_predicts_a_test_file_without_answers(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(jsonl(answered("a"), answered("b")))
    test = tmp_path / "test.jsonl"
    test.write_text(jsonl({"id": "t", "question": "w1", "context": "w3 w4"}))
    data = task_lib.get(qa_model.TASK).read(_qa_data(str(train), str(train), str(test)), TOKENIZER)
    assert data.validation[0].has_labels and not data.test[0].has_labels
    assert not data.test[0].version_2  # the training data's task


def _qa_data(train: str, validation: str, test: str):
    return FinetuneDataSettings(
        train=train,
        validation=((layouts.VALIDATION, validation),),
        test=((layouts.TEST, test),),
        layouts=(),
        glue_task="",
        labels=None,
        max_seq_length=QA_SETTINGS.max_seq_length,
        task_settings=QA_SETTINGS,
    )


def test_a_training_question_without_tokens_names_its_record(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(jsonl(answered("a"), answered("b", question="\x01\x02")))
    message = r"train\.jsonl line 2: question \('\\x01\\x02'\) has no tokens"
    with pytest.raises(TaskDataError, match=message):
        task_lib.get(qa_model.TASK).read(_qa_data(str(train), str(train), str(train)), TOKENIZER)


# ------------------------------------------------------------------------------ retrieval files


def _retrieval(tmp_path, queries: bytes, corpus: bytes, relevance: bytes = b"q1\td1\n"):
    paths = []
    for name, content in (("q.tsv", queries), ("c.tsv", corpus), ("r.tsv", relevance)):
        (tmp_path / name).write_bytes(content)
        paths.append(str(tmp_path / name))
    return embed_task.read_retrieval(*paths, TOKENIZER, 16)


def test_retrieval_files_that_are_not_utf8_name_file_line_and_column(tmp_path):
    with pytest.raises(TaskDataError) as err:
        _retrieval(tmp_path, b"q1\tw1\nq2\tcaf\xe9\n", b"d1\tw2\n")
    assert "q.tsv line 2: byte 0xe9 at column 7 is not UTF-8" in one_line(err)


def test_a_duplicate_retrieval_id_names_the_id_and_both_lines(tmp_path):
    with pytest.raises(TaskDataError) as err:
        _retrieval(tmp_path, b"q1\tw1\n", b"d1\tw2\n\nd2\tw3\nd1\tw4\n")
    assert "c.tsv line 4: id 'd1' was already used at line 1" in one_line(err)


def test_an_empty_retrieval_text_is_refused(tmp_path):
    with pytest.raises(TaskDataError) as err:
        _retrieval(tmp_path, b"q1\tw1\nq2\t  \n", b"d1\tw2\n")
    assert "q.tsv line 2: the text of id 'q2' is empty" in one_line(err)


def test_retrieval_lines_end_at_newline_only(tmp_path):
    split = _retrieval(tmp_path, "q1\tw1\u2028w2\r\n".encode(), "d1\tw2\u2029w3\n".encode())
    assert split.queries == 1 and split.indices == ["q1", "d1"]


# ------------------------------------------------------------------------------ seq2seq files


def _seq2seq_read_error(source, tmp_path, file: str, index: int, line: str) -> str:
    """The one-line error of reading the seq2seq data of `source` whose `file` holds `line` at
    `index` (the header is line 1, so index k is line k + 1)."""
    write_data(tmp_path, 16, 8, 4)
    lines = (tmp_path / file).read_text().splitlines()
    lines[index] = line
    (tmp_path / file).write_text("\n".join(lines) + "\n")
    settings = FinetuneSettings.from_config(make_config(source, tmp_path))
    tokenizer = WordPieceTokenizer.from_vocab(source / "vocab.txt")
    with pytest.raises(TaskDataError) as err:
        task_lib.get(s2s.TASK).read(settings.data, tokenizer)
    return one_line(err)


def test_a_source_without_tokens_names_file_line_and_field(source, tmp_path):  # noqa: F811
    message = _seq2seq_read_error(source, tmp_path, "train.tsv", 12, "\x01\x02\tw1 w2")
    assert "train.tsv line 13: field 'source'" in message and "has no tokens" in message


def test_a_target_without_tokens_names_file_line_and_field(source, tmp_path):  # noqa: F811
    message = _seq2seq_read_error(source, tmp_path, "dev.tsv", 3, "w1 w2\t\x01")
    assert "dev.tsv line 4: field 'target' ('\\x01') has no tokens" in message


def test_an_empty_target_names_file_line_and_field(source, tmp_path):  # noqa: F811
    message = _seq2seq_read_error(source, tmp_path, "train.tsv", 2, "w1 w2\t ")
    assert "train.tsv line 3: field 'target' is empty" in message


def test_a_classification_text_without_tokens_names_file_and_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nw1\ta\n\x01\tb\n")
    layout = layouts.Layout(layouts.TSV, ("text",), "label")
    split = task_data.read_split(path, layout, "train", True)
    head = label_data.head_for("classification", split)
    with pytest.raises(TaskDataError) as err:
        label_data.encode(split, head, TOKENIZER, 8)
    assert "train.tsv line 3: the text ('\\x01') has no tokens" in one_line(err)


def test_max_source_length_is_named_in_its_own_messages(source, tmp_path):  # noqa: F811
    write_data(tmp_path, 16, 8, 4)
    config = make_config(source, tmp_path, **{"data.max_source_length": 300})
    settings = FinetuneSettings.from_config(config)
    with pytest.raises(ConfigError) as err:
        settings.model_config(bert_config())
    assert one_line(err).startswith("config.data.max_source_length=300: exceeds")


def test_unset_dropout_is_the_familys_and_a_set_one_applies_to_every_family(source, tmp_path):  # noqa: F811
    """config.model's dropouts unset: BERT fine-tunes at google's 0.1 whatever it was
    pretrained with; ModernBERT keeps its checkpoint's own, as transformers trains it. Set,
    they apply to either family (ModernBERT reads hidden_dropout as its embeddings' and
    feed-forward's)."""
    write_data(tmp_path, 16, 8, 4)
    modern = ModernBertConfig(embedding_dropout=0.0, mlp_dropout=0.05, attention_dropout=0.0)
    unset = FinetuneSettings.from_config(make_config(source, tmp_path))
    bert = unset.model_config(bert_config(hidden_dropout=0.0, attention_dropout=0.0))
    assert (bert.hidden_dropout, bert.attention_dropout) == (0.1, 0.1)
    kept = unset.model_config(modern)
    assert (kept.embedding_dropout, kept.mlp_dropout, kept.attention_dropout) == (0.0, 0.05, 0.0)

    fields = {"model.hidden_dropout": 0.2, "model.attention_dropout": 0.3}
    given = FinetuneSettings.from_config(make_config(source, tmp_path, **fields))
    bert = given.model_config(bert_config())
    assert (bert.hidden_dropout, bert.attention_dropout) == (0.2, 0.3)
    changed = given.model_config(modern)
    assert (changed.embedding_dropout, changed.mlp_dropout, changed.attention_dropout) == (
        0.2,
        0.2,
        0.3,
    )


# ------------------------------------------------------------------------------ notebook methods


def _zeros(init) -> dict:
    """Parameters of `init`'s shapes, all zero: these tests check arguments, not values."""
    return jax.tree.map(
        lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(init, jax.random.key(0))
    )


def _model(head: HeadSpec, config: BertConfig = CONFIG) -> Model:
    return Model(config, _zeros(capability_lib.of(head).init(config, head)), TOKENIZER, head=head)


@pytest.fixture(scope="module")
def models() -> dict[str, Model]:
    return {
        "qa": _model(HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS)),
        "seq2seq": _model(TaskOptions(decoder_start_id=2, eos_id=3).head()),
        "embedding": _model(embed_task.head_for(EmbeddingSpec(max_seq_length=16))),
        "classification": _model(HeadSpec("classification", ("a", "b"))),
        "tokens": _model(HeadSpec("token_classification", ("O", "X"))),
        "encoder": _model_encoder(),
    }


def _model_encoder() -> Model:
    from bertjax.encoders.bert.model import BertForPreTraining, pretraining_init

    return Model(CONFIG, _zeros(pretraining_init(BertForPreTraining(CONFIG), 1, 1)), TOKENIZER)


@pytest.fixture
def untouched(monkeypatch):
    """A model whose tokenizer and compiled functions fail the test when used."""

    def guard(model: Model) -> Model:
        def refuse(*args, **kwargs):
            raise AssertionError("an argument reached the tokenizer or the model unchecked")

        monkeypatch.setattr(model, "batched", refuse)
        for name in ("encode", "encode_batch", "encode_with_offsets"):
            monkeypatch.setattr(model.tokenizer, name, refuse)
        return model

    return guard


CONTEXT = "w3 w4 w5 w6"


@pytest.mark.parametrize(
    "args, options, message",
    [
        ((None, CONTEXT), {}, r"^question must be a str or a list of str, got NoneType$"),
        (([], CONTEXT), {}, r"^question is an empty list"),
        ((["w1", 7], CONTEXT), {}, r"^question\[1\] is of type int, not str$"),
        (("", CONTEXT), {}, r"^question='' is empty"),
        ((["w1", " "], CONTEXT), {}, r"^question\[1\]=' ' is empty"),
        (("w1", "  \n"), {}, r"^context='  \\n' is empty"),
        (("w1", None), {}, r"^context must be a str or a list of str"),
        ((["w1", "w2"], [CONTEXT]), {}, r"2 question\(s\) but 1 context\(s\)"),
        (("w1", CONTEXT), {"doc_stride": -8}, r"^doc_stride=-8 is invalid: must be an int >= 1"),
        (("w1", CONTEXT), {"doc_stride": 2.5}, r"^doc_stride=2.5 is invalid: must be an int$"),
        (("w1", CONTEXT), {"max_seq_len": 4}, r"^max_seq_len=4 is invalid: must be an int >= 5"),
        (("w1", CONTEXT), {"max_question_len": 0}, r"^max_question_len=0 is invalid"),
        (("w1", CONTEXT), {"max_answer_len": None}, r"^max_answer_len=None is invalid"),
        (("w1", CONTEXT), {"top_k": 0}, r"^top_k=0 is invalid: must be an int >= 1"),
        (("w1", CONTEXT), {"top_k": True}, r"^top_k=True is invalid"),
        (("w1", CONTEXT), {"handle_impossible_answer": "yes"}, r"^handle_impossible_answer="),
        (("w1", CONTEXT), {"align_to_words": None}, r"^align_to_words=None is invalid"),
    ],
)
def test_answer_checks_its_arguments(models, untouched, args, options, message):
    model = untouched(models["qa"])
    with pytest.raises(InferenceError, match=message) as err:
        model.answer(*args, **options)
    one_line(err)


def test_answer_refuses_text_without_tokens(models):
    with pytest.raises(InferenceError, match=r"^question\[1\]='\\x01' has no tokens") as err:
        models["qa"].answer(["w1", "\x01"], CONTEXT)
    one_line(err)
    with pytest.raises(InferenceError, match=r"^context='\\x02\\x03' has no tokens"):
        models["qa"].answer("w1", "\x02\x03")


@pytest.mark.parametrize(
    "args, options, message",
    [
        ((None,), {}, r"^texts must be a str or a list of str, got NoneType$"),
        (([],), {}, r"^texts is an empty list"),
        ((["w1", 3],), {}, r"^texts\[1\] is of type int, not str$"),
        (("w1",), {"num_beams": 0}, r"^num_beams=0 is invalid: must be an int >= 1"),
        (("w1",), {"num_beams": 1.5}, r"^num_beams=1.5 is invalid"),
        (("w1",), {"max_new_tokens": 0}, r"^max_new_tokens=0 is invalid: must be an int >= 1"),
        (("w1",), {"max_new_tokens": 40}, r"^max_new_tokens=40 is invalid: the decoder has 32"),
        (("w1",), {"max_length": 2}, r"^max_length=2 is invalid: must be in \[3, 32\]"),
        (("w1",), {"max_length": "8"}, r"^max_length='8' is invalid: must be an int"),
        (("w1",), {"length_penalty": None}, r"^length_penalty=None is invalid"),
    ],
)
def test_generate_checks_its_arguments(models, untouched, args, options, message):
    model = untouched(models["seq2seq"])
    with pytest.raises(InferenceError, match=message) as err:
        model.generate(*args, **{"max_new_tokens": 8, **options})
    one_line(err)


@pytest.mark.parametrize(
    "model_name, args, options, message",
    [
        ("embedding", (None,), {}, r"^texts must be a str or a list of str"),
        ("embedding", ([],), {}, r"^texts is an empty list"),
        ("embedding", ([b"w1"],), {}, r"^texts\[0\] is of type bytes, not str$"),
        ("encoder", (None,), {}, r"^texts must be a str or a list of str"),
        ("encoder", (["w1"],), {"pooling": "max"}, r"^pooling='max' is invalid"),
        ("encoder", (["w1"],), {"pooling": ["cls"]}, r"^pooling=\['cls'\] is invalid"),
        ("encoder", (["w1"],), {"normalize": "yes"}, r"^normalize='yes' is invalid"),
    ],
)
def test_embed_checks_its_arguments(models, untouched, model_name, args, options, message):
    model = untouched(models[model_name])
    with pytest.raises(InferenceError, match=message) as err:
        model.embed(*args, **options)
    one_line(err)


@pytest.mark.parametrize(
    "args, options, message",
    [
        ((None, ["w1"]), {}, r"^queries must be a str or a list of str, got NoneType$"),
        ((["w1"], []), {}, r"^corpus is an empty list"),
        ((["w1"], ["w2", 5]), {}, r"^corpus\[1\] is of type int, not str$"),
        ((["w1"], ["w2"]), {"top_k": 0}, r"^top_k=0 is invalid: must be an int >= 1"),
        ((["w1"], ["w2"]), {"top_k": "3"}, r"^top_k='3' is invalid: must be an int$"),
        ((np.ones((2, 3)), np.ones((4, 5))), {}, r"queries and \[m, h\] corpus of the same width"),
        ((np.ones(3), np.ones((4, 3))), {}, r"^queries has shape \(3,\)"),
        ((np.ones((1, 3)), np.ones((0, 3))), {}, r"^corpus has shape \(0, 3\)"),
    ],
)
def test_search_checks_its_arguments(models, untouched, args, options, message):
    model = untouched(models["embedding"])
    with pytest.raises(InferenceError, match=message) as err:
        model.search(*args, **options)
    one_line(err)


def test_similarity_names_the_mismatch(models, untouched):
    model = untouched(models["embedding"])
    with pytest.raises(InferenceError, match=r"got \(2, 3\) and \(2, 4\)") as err:
        model.similarity(np.ones((2, 3)), np.ones((2, 4)))
    one_line(err)
    nan = np.ones((2, 3))
    nan[1, 2] = np.nan
    with pytest.raises(InferenceError, match=r"^b\[1\] holds a NaN or infinite value"):
        model.similarity(np.ones((2, 3)), nan)
    with pytest.raises(InferenceError, match=r"^a must be a str or a list of str"):
        model.similarity(None, np.ones((2, 3)))
    assert model.similarity(np.ones((1, 3)), np.ones((2, 3))).shape == (1, 2)


@pytest.mark.parametrize(
    "args, options, message",
    [
        ((None,), {}, r"^texts must be a str or a list of str, got NoneType$"),
        (([],), {}, r"^texts is an empty list"),
        ((["w1", 2],), {}, r"^texts\[1\] is of type int, not str$"),
        ((["w1"],), {"text_pairs": [None]}, r"^text_pairs\[0\] is of type NoneType, not str$"),
        ((["w1"],), {"text_pairs": ["w2", "w3"]}, r"^text_pairs has 2 texts but texts has 1"),
        ((["w1"],), {"max_length": 1}, r"^max_length=1 is invalid: must be in \[3, 32\]"),
        ((["w1"],), {"max_length": 3.0}, r"^max_length=3.0 is invalid: must be an int"),
    ],
)
def test_predict_checks_its_arguments(models, untouched, args, options, message):
    model = untouched(models["classification"])
    with pytest.raises(InferenceError, match=message) as err:
        model.predict(*args, **options)
    one_line(err)


@pytest.mark.parametrize(
    "args, options, message",
    [
        ((None,), {}, r"^texts must be a str or a list of str, got NoneType$"),
        ((["w1", " "],), {}, r"^text 1 is empty"),
        ((["w1"],), {"text_pairs": ["w2"]}, r"^token classification labels single texts"),
        ((["w1"],), {"max_length": 2}, r"^max_length=2 is invalid: must be an int in \[3, 32\]"),
        ((["w1"],), {"max_length": "8"}, r"^max_length='8' is invalid: must be an int$"),
    ],
)
def test_predict_words_checks_its_arguments(models, untouched, args, options, message):
    model = untouched(models["tokens"])
    with pytest.raises(InferenceError, match=message) as err:
        model.predict(*args, **options)
    one_line(err)


def test_good_arguments_still_answer_generate_search_and_predict(models):
    found = models["qa"].answer(
        "w1 \U0001f600", "w3 \u65e5\u672c w4 w5", max_seq_len=8, doc_stride=1
    )
    assert set(found) == {"score", "start", "end", "answer"}
    generated = models["seq2seq"].generate(["w1 w2", "w3"], num_beams=1, max_new_tokens=3)
    assert len(generated) == 2 and all(isinstance(text, str) for text in generated)
    hits = models["embedding"].search("w1", ["w2", "w3"], top_k=5)
    assert len(hits) == 1 and len(hits[0]) == 2
    assert models["classification"].predict("w1 w2")["label"] in ("a", "b")
