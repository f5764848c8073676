"""A text's encoding and answers never depend on the other texts of a call.

Tokenizer files carry call-time settings (padding, truncation) that bertjax ignores, for every
kind of tokenizer; the notebook methods and fine-tuning's readers give a text the same result
alone as inside a batch of texts of very different lengths.
"""

import csv
import itertools
import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.text import features as features_lib
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import Tokenizer
from configs import finetune as finetune_recipe
from tests.helpers.tokenizer_kinds import (
    FILE_TRUNCATION,
    KINDS,
    text_of,
    with_call_settings,
    write_tokenizer,
)
from tests.helpers.user_texts import with_literals

FILE_KINDS = ("wordpiece", "pipeline")  # the kinds read from a tokenizer.json


@pytest.fixture(scope="module")
def plain_files(tmp_path_factory):
    """kind -> (directory, tokenizer) without call-time settings in its file."""
    root = tmp_path_factory.mktemp("plain")
    return {
        kind: (root / kind, write_tokenizer(kind, root / kind, padded=False)) for kind in FILE_KINDS
    }


@pytest.mark.parametrize("fixed", [None, 64], ids=["batch_longest", "fixed"])
@pytest.mark.parametrize("kind", FILE_KINDS)
def test_a_files_padding_and_truncation_never_shape_the_ids(kind, fixed, plain_files, tmp_path):
    directory, plain = plain_files[kind]
    text = (directory / "tokenizer.json").read_text()
    padded = with_call_settings(text, plain.pad_id, fixed=fixed)
    (tmp_path / "tokenizer.json").write_text(padded)
    (tmp_path / "tokenizer_config.json").write_text(
        (directory / "tokenizer_config.json").read_text()
    )
    short, long = "See [MASK] for details.", text_of(3 * FILE_TRUNCATION, seed=1)
    expected = [plain.encode(short), plain.encode(long)]
    assert len(expected[1]) > FILE_TRUNCATION and len(expected[0]) < FILE_TRUNCATION
    for tok in (Tokenizer.load(tmp_path / "tokenizer.json"), load_tokenizer(tmp_path)):
        assert tok.kind == plain.kind and tok.fingerprint == plain.fingerprint
        assert tok.encode(short) == expected[0] and tok.encode(long) == expected[1]
        assert tok.encode_batch([short, long]) == expected
        assert tok.encode_batch([long, short]) == expected[::-1]
        in_text = tok.encode_batch([short, long], special_tokens_in_text=True)
        assert in_text[0] == plain.encode(short, special_tokens_in_text=True)
        assert tok.mask_id in in_text[0] and tok.pad_id not in in_text[0]
        assert [ids for ids, _ in tok.encode_with_offsets([short, long])] == expected
        assert tok.encode_words(["see", "details"]) == plain.encode_words(["see", "details"])
        # What bertjax writes back carries no call-time settings.
        tok.save(tmp_path / "saved.json")
        tok.save_hf(tmp_path / "export")
        for written in (tmp_path / "saved.json", tmp_path / "export" / "tokenizer.json"):
            spec = json.loads(written.read_text())
            assert spec["padding"] is None and spec["truncation"] is None


# ----------------------------------------------------------------------------- a text's ids

# Word counts that cross everything a batch could leak through: a one-word text, the file's
# truncation length, the positions of the models below, far past them.
LENGTHS = st.integers(min_value=1, max_value=6 * FILE_TRUNCATION)
MIXES = st.lists(LENGTHS, min_size=2, max_size=6)


@pytest.fixture(scope="module")
def hub_tokenizers(tmp_path_factory):
    """Every kind as the hub ships it (tokenizer.json with padding and truncation)."""
    root = tmp_path_factory.mktemp("hub")
    return {kind: write_tokenizer(kind, root / kind) for kind in KINDS}


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(lengths=MIXES, seed=st.integers(0, 2**16), data=st.data())
def test_a_texts_inputs_do_not_depend_on_the_other_texts(hub_tokenizers, lengths, seed, data):
    # Texts as users type them: some hold a special token's literal ("[MASK]", "[PAD]", ...).
    texts = [text_of(n, seed + i) for i, n in enumerate(lengths)]
    texts = [data.draw(st.just(t) | with_literals(t)) for t in texts]
    pairs = [text_of(n, seed + 1000 + i) for i, n in enumerate(reversed(lengths))]
    limit = 64
    for tok in hub_tokenizers.values():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", features_lib.TruncationWarning)
            together = features_lib.inputs(tok, texts, pairs, limit, limit=limit)
            for read in (False, True):  # special tokens in the text as text, or read as such
                mixed = tok.encode_batch(texts, special_tokens_in_text=read)
                assert mixed == [tok.encode(t, special_tokens_in_text=read) for t in texts]
            for i, (text, pair) in enumerate(zip(texts, pairs)):
                (alone,) = features_lib.inputs(tok, [text], [pair], limit, limit=limit)
                assert alone.ids == together[i].ids and alone.segments == together[i].segments
                assert alone.ids[0] == tok.cls_id and alone.ids[-1] == tok.sep_id
                # No padding: a pad id only where the text wrote "[PAD]".
                assert alone.ids.count(tok.pad_id) <= text.count("[PAD]"), tok.kind


# ------------------------------------------------------------------------ fine-tuning's readers


READER_TASKS = ("classification", "question_answering", "seq2seq")
MAX_SEQ_LENGTH = 64


def _write_rows(path, task, rows):
    """A task's file of (key, text, other text) rows: classification as CSV, the others as
    JSON Lines with the key as id."""
    if task == "classification":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows([text, "yes" if key % 2 else "no"] for key, text, _ in rows)
        return
    records = []
    for key, text, other in rows:
        if task == "question_answering":
            start = other.index(" ") + 1
            answer = other[start:].split(" ")[0]
            answers = {"text": [answer], "answer_start": [start]}
            records.append({"question": text, "context": other, "answers": answers})
        else:  # seq2seq
            records.append({"source": text, "target": other})
        records[-1]["id"] = str(key)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _rows_by_key(tmp_path, name, task, rows, tokenizer) -> dict[str, list]:
    """The encoded training split of a file holding `rows`: each row's key -> its input ids
    (QA: of each of its windows)."""
    path = tmp_path / f"{name}.{'csv' if task == 'classification' else 'jsonl'}"
    _write_rows(path, task, rows)
    config = finetune_recipe.get_config()
    config.task = task
    config.init_from = str(tmp_path)
    config.data.train = config.data.validation = str(path)
    config.data.max_seq_length = MAX_SEQ_LENGTH
    config.qa.max_query_length = 16
    config.qa.doc_stride = 16
    config.batch_size = config.eval_batch_size = 8
    ft = FinetuneSettings.from_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train = task_lib.get(task).read(ft.data, tokenizer).train
    keys = [str(key) for key, _, _ in rows]
    by_key: dict[str, list] = {}
    for index, ids in zip(train.indices, train.features["input_ids"]):
        # A SQuAD example is known by its id, the other rows by their place in the file.
        key = index if task == "question_answering" else keys[int(index)]
        by_key.setdefault(key, []).append(ids.tolist())
    return by_key


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lengths=st.lists(LENGTHS, min_size=3, max_size=6), seed=st.integers(0, 2**16), data=st.data()
)
def test_a_rows_input_ids_do_not_depend_on_its_neighbours(
    hub_tokenizers, tmp_path_factory, lengths, seed, data
):
    texts = [text_of(n, seed + i) for i, n in enumerate(lengths)]
    texts = [data.draw(st.just(t) | with_literals(t)) for t in texts]
    rows = [(i, text, text_of(12, seed + 1000 + i)) for i, text in enumerate(texts)]
    for kind, task in itertools.product(KINDS, READER_TASKS):
        tmp_path = tmp_path_factory.mktemp("reader")
        tok = hub_tokenizers[kind]
        forward = _rows_by_key(tmp_path, "forward", task, rows, tok)
        backward = _rows_by_key(tmp_path, "backward", task, rows[::-1], tok)
        # Beside a one-word neighbour, and beside one far past the positions.
        for neighbour in ("See.", text_of(150, seed)):
            pair = [rows[0], (1, neighbour, rows[1][2])]
            assert _rows_by_key(tmp_path, "pair", task, pair, tok)["0"] == forward["0"]
        assert forward == backward and len(forward) == len(rows), (kind, task)
        if task != "question_answering":  # one text per row: [CLS] text [SEP], zero-padded
            for key, text, _ in rows:
                ids = tok.encode(text, special_tokens_in_text=True)[: MAX_SEQ_LENGTH - 2]
                ids = [tok.cls_id, *ids, tok.sep_id]
                (row,) = forward[str(key)]
                assert row == ids + [0] * (MAX_SEQ_LENGTH - len(ids)), (kind, task)
