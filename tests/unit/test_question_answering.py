"""Extractive question answering: reading, windows and max context, decoding, the official
scorer, the head's loss, answer(), and a short run that learns a synthetic task (transformers
parity both ways: tests/parity/test_question_answering_parity.py)."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import Model
from bertjax.encoders.bert.config import BertConfig
from bertjax.tasks.qa import decode as qa_decode
from bertjax.tasks.qa import metrics as qa_metrics
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad as qa
from bertjax.tasks.qa.answer import window_logits
from bertjax.text.tokenizer import WordPieceTokenizer
from bertjax.text.training import TokenizerSettings, train_tokenizer
from tests.helpers.question_answering import (
    CONFIG,
    TOKENIZER,
    WORDS,
    qa_head,
    random_params,
    synthetic_examples,
)
from tests.helpers.tokenizer import training_sentences

# Every word is one token; [CLS] q1 q2 [SEP] puts the context at position 4.
SETTINGS = qa.QASettings(max_seq_length=11, doc_stride=3, max_query_length=4, n_best_size=5)
CONTEXT_START = 4
# Twelve words with uneven spacing and case: answers come back as the original characters.
CONTEXT = "W0 w1  w2 w3 W4 w5\tw6 w7 w8  w9 w10 W11"


def answering_model(config: BertConfig, params, tokenizer) -> Model:
    """A question-answering Model of these parameters, as a notebook holds one."""
    return Model(config, params, tokenizer, head=qa_head())


def char_span(first: int, last: int, context: str = CONTEXT) -> tuple[int, int]:
    """Characters of context words first..last (inclusive)."""
    starts, position = [], 0
    for word in context.split():
        position = context.index(word, position)
        starts.append((position, position + len(word)))
        position += len(word)
    return starts[first][0], starts[last][1]


def example(first: int | None, last: int | None = None, qid: str = "q") -> qa.QAExample:
    """A question about CONTEXT whose answer is words first..last (None: unanswerable)."""
    if first is None:
        return qa.QAExample(qid, "q1 q2", CONTEXT, (), is_impossible=True)
    start, end = char_span(first, last)
    return qa.QAExample(qid, "q1 q2", CONTEXT, (qa.Answer(CONTEXT[start:end], start),))


# ----------------------------------------------------------------------------- windows


def test_doc_spans_follow_run_squad():
    assert qa.doc_spans(12, 6, 3) == [(0, 6), (3, 6), (6, 6)]
    assert qa.doc_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert qa.doc_spans(13, 6, 3) == [(0, 6), (3, 6), (6, 6), (9, 4)]
    assert qa.doc_spans(3, 6, 3) == [(0, 3)]  # shorter than one window
    assert qa.doc_spans(0, 6, 3) == [(0, 0)]
    assert qa.doc_spans(12, 6, 10) == [(0, 6), (6, 6)]  # a stride past the window: no gap


def test_max_context_by_google_score():
    flags = qa.max_context_flags([(0, 6), (3, 6), (6, 6)])
    # Token 4: min(4, 1) in window 0 ties min(1, 4) in window 1, and the first window wins;
    # token 5: 0 context on the right in window 0, 2 in window 1.
    assert flags[0].tolist() == [True, True, True, True, True, False]
    assert flags[1].tolist() == [False, False, True, True, True, False]
    assert flags[2].tolist() == [False, False, True, True, True, True]
    # Every token has exactly one max-context window.
    counts = np.zeros(12, int)
    for (start, length), flag in zip([(0, 6), (3, 6), (6, 6)], flags):
        counts[start : start + length] += flag
    assert counts.tolist() == [1] * 12


def test_windows_inputs_and_offsets():
    features = qa.make_features([example(4, 5)], TOKENIZER, SETTINGS, training=False)
    assert len(features) == 3
    w = {piece: i for i, piece in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    words = [f"w{i}" for i in range(12)]
    assert features.input_ids[1].tolist() == [
        w["[CLS]"],
        w["q1"],
        w["q2"],
        w["[SEP]"],
        *[w[x] for x in words[3:9]],
        w["[SEP]"],
    ]
    assert features.segment_ids[1].tolist() == [0] * 4 + [1] * 7
    assert features.input_mask.sum(axis=1).tolist() == [11, 11, 11]
    # Offsets only on context tokens, pointing at the original (cased) characters.
    assert (features.offsets[:, :CONTEXT_START] == qa.NO_OFFSET).all()
    assert (features.offsets[:, -1] == qa.NO_OFFSET).all()  # the final [SEP]
    start, end = features.offsets[2, CONTEXT_START + 5]
    assert CONTEXT[start:end] == "W11"
    assert features.max_context[1, CONTEXT_START:10].tolist() == [
        False,
        False,
        True,
        True,
        True,
        False,
    ]


def test_training_positions_answer_in_the_overlap():
    features = qa.make_features([example(4, 5)], TOKENIZER, SETTINGS, training=True)
    # Tokens 4..5 are in window 0 (tokens 0..5) and window 1 (3..8), not in window 2 (6..11).
    assert features.start_positions.tolist() == [CONTEXT_START + 4, CONTEXT_START + 1, 0]
    assert features.end_positions.tolist() == [CONTEXT_START + 5, CONTEXT_START + 2, 0]


def test_training_positions_answer_split_across_windows():
    features = qa.make_features(
        [example(5, 7, "a"), example(2, 7, "b")], TOKENIZER, SETTINGS, training=True
    )
    # 5..7 is whole only in window 1; 2..7 is whole in none: every window points at [CLS].
    assert features.example_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert features.start_positions.tolist() == [0, CONTEXT_START + 2, 0, 0, 0, 0]
    assert features.end_positions.tolist() == [0, CONTEXT_START + 4, 0, 0, 0, 0]


def test_impossible_question_and_short_context():
    short = qa.QAExample("s", "q1", "the cat w3", (qa.Answer("cat", 4),))
    features = qa.make_features(
        [example(None, qid="none"), short], TOKENIZER, SETTINGS, training=True
    )
    assert features.example_index.tolist() == [0, 0, 0, 1]
    assert features.start_positions.tolist() == [0, 0, 0, 4]  # [CLS] q1 [SEP] the cat
    assert features.end_positions.tolist() == [0, 0, 0, 4]
    assert features.input_mask[3].tolist() == [1] * 7 + [0] * 4
    assert features.max_context[3, 3:6].all()


def test_mismatched_answer_is_skipped_for_training_only():
    bad = qa.QAExample("bad", "q1", CONTEXT, (qa.Answer("w5", 0),))
    training = qa.make_features([bad, example(4, 5)], TOKENIZER, SETTINGS, training=True)
    assert training.skipped == ("bad",)
    assert set(training.example_index.tolist()) == {1}
    evaluation = qa.make_features([bad, example(4, 5)], TOKENIZER, SETTINGS, training=False)
    assert evaluation.skipped == () and set(evaluation.example_index.tolist()) == {0, 1}


def test_query_is_cut_to_max_query_length():
    long_question = qa.QAExample("l", "q1 " * 10, CONTEXT, (qa.Answer("w1", 3),))
    features = qa.make_features([long_question], TOKENIZER, SETTINGS, training=True)
    assert features.segment_ids[0].tolist()[:6] == [0] * 6  # [CLS] + 4 question + [SEP]
    assert features.start_positions[0] == 6 + 1


# ----------------------------------------------------------------------------- offsets


def test_wordpiece_offsets_are_the_original_characters():
    text = "  Thé  CAFÉ,  w3"
    tokenizer = WordPieceTokenizer(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "caf", "##e", ",", "w3"]
    )
    (spans,) = qa.token_offsets(tokenizer, [text])
    assert spans.ids == tokenizer.encode(text)
    assert [text[s:e] for s, e in spans.offsets] == ["Thé", "CAF", "É", ",", "w3"]


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / "qa.model"
    sentences = training_sentences(1000)
    return train_tokenizer(sentences, TokenizerSettings(vocab_size=800, num_threads=1), path)


def test_sentencepiece_offsets_cover_each_character_once(sentencepiece):
    text = "  The  café sat ☃ on ① mat."
    (spans,) = qa.token_offsets(sentencepiece, [text])
    assert spans.ids == sentencepiece.encode(text)
    covered = sorted({(int(s), int(e)) for s, e in spans.offsets if s != qa.NO_OFFSET})
    pieces = [text[s:e] for s, e in covered]
    assert all(p and not p[0].isspace() for p in pieces)
    # Disjoint, in order, and together every non-space character.
    assert all(a[1] <= b[0] for a, b in zip(covered, covered[1:]))
    assert "".join(pieces) == "".join(text.split())
    # The snowman is byte-fallback pieces after a lone word-boundary piece: all of them
    # carry its span (the tokenizer's offsets put that piece at the word it starts).
    snowman = text.index("☃")
    byte_pieces = [k for k, (s, e) in enumerate(spans.offsets) if (s, e) == (snowman, snowman + 1)]
    assert [sentencepiece.id_to_piece(spans.ids[k]) for k in byte_pieces] == [
        "▁",
        "<0xE2>",
        "<0x98>",
        "<0x83>",
    ]


def test_sentencepiece_answer_maps_to_tokens_and_back(sentencepiece):
    context = "The town of Paris sat on hills while ☃ dogs ran."
    start = context.index("Paris sat")
    ex = qa.QAExample("p", "where", context, (qa.Answer("Paris sat", start),))
    settings = qa.QASettings(max_seq_length=64, max_query_length=8)
    features = qa.make_features([ex], sentencepiece, settings, training=True)
    s, e = features.start_positions[0], features.end_positions[0]
    assert context[features.offsets[0, s, 0] : features.offsets[0, e, 1]] == "Paris sat"


# ----------------------------------------------------------------------------- decoding


def logits_for(features, spans, null=None):
    """Start/end logits [n, seq]: 0 everywhere, `spans` (row, start, end, value) raised."""
    starts = np.zeros(features.input_ids.shape, np.float32)
    ends = np.zeros(features.input_ids.shape, np.float32)
    for row, s, e, value in spans:
        starts[row, s] += value
        ends[row, e] += value
    if null is not None:
        for row, value in enumerate(null):
            starts[row, 0] = ends[row, 0] = value / 2
    return starts, ends


def test_decode_takes_the_best_span_from_max_context_windows():
    features = qa.make_features([example(4, 5)], TOKENIZER, SETTINGS, training=False)
    starts, ends = logits_for(
        features,
        [
            (1, CONTEXT_START + 2, CONTEXT_START + 3, 5.0),  # tokens 5..6 in window 1
            (0, CONTEXT_START + 5, CONTEXT_START + 5, 9.0),  # token 5 is not max-context here
            (2, 1, 2, 20.0),  # the question: never an answer
            (2, CONTEXT_START + 4, CONTEXT_START + 1, 8.0),  # end before start
        ],
    )
    # Below the context tokens elsewhere, so that every window offers n-best candidates.
    outside = features.offsets[..., 0] == qa.NO_OFFSET
    starts[outside] -= 1.0
    ends[outside] -= 1.0
    result = qa_decode.decode([example(4, 5)], features, starts, ends, SETTINGS, version_2=False)
    start, end = char_span(5, 6)
    assert result.predictions == {"q": CONTEXT[start:end]} == {"q": "w5\tw6"}
    best = result.nbest["q"][0]
    assert (best.start, best.end, best.start_logit, best.end_logit) == (start, end, 5.0, 5.0)
    assert result.null_odds is None
    nbest = result.nbest["q"]
    assert len(nbest) == SETTINGS.n_best_size
    assert len({c.text for c in nbest}) == len(nbest)  # deduplicated by text
    assert sum(c.probability for c in nbest) == pytest.approx(1.0)
    assert [c.start_logit + c.end_logit for c in nbest] == sorted(
        (c.start_logit + c.end_logit for c in nbest), reverse=True
    )


def test_decode_max_answer_length():
    settings = qa.QASettings(**{**vars(SETTINGS), "max_answer_length": 2})
    features = qa.make_features([example(0, 0)], TOKENIZER, settings, training=False)
    starts, ends = logits_for(
        features, [(0, CONTEXT_START, CONTEXT_START + 2, 9.0), (0, CONTEXT_START + 1, 5, 2.0)]
    )
    result = qa_decode.decode([example(0, 0)], features, starts, ends, settings, version_2=False)
    # 0..2 is three tokens: too long; the start token 0 with end 1 is the best that fits.
    assert result.predictions["q"] == CONTEXT[slice(*char_span(0, 1))]


def test_decode_version_2_null_answer():
    ex = example(None)
    features = qa.make_features([ex], TOKENIZER, SETTINGS, training=False)
    span = [(1, CONTEXT_START + 2, CONTEXT_START + 2, 3.0)]  # "w5" scores 6
    # Null score: the lowest [CLS] start + end over the windows, 4.0 in window 2.
    starts, ends = logits_for(features, span, null=[7.0, 5.0, 4.0])
    result = qa_decode.decode([ex], features, starts, ends, SETTINGS, version_2=True)
    assert result.null_odds == {"q": pytest.approx(4.0 - 6.0)}
    assert result.predictions == {"q": "w5"}
    raised = qa.QASettings(**{**vars(SETTINGS), "null_score_diff_threshold": -3.0})
    result = qa_decode.decode([ex], features, starts, ends, raised, version_2=True)
    assert result.predictions == {"q": ""}
    texts = [c.text for c in result.nbest["q"]]
    assert "" in texts and texts[0] == "w5"
    null = result.nbest["q"][texts.index("")]
    assert (null.start_logit, null.end_logit) == (2.0, 2.0)


def test_write_predictions_official_formats(tmp_path):
    ex = example(None)
    features = qa.make_features([ex], TOKENIZER, SETTINGS, training=False)
    starts, ends = logits_for(features, [(1, 6, 6, 3.0)], null=[7.0, 5.0, 4.0])
    result = qa_decode.decode([ex], features, starts, ends, SETTINGS, version_2=True)
    written = qa_decode.write_predictions(tmp_path, result)
    assert sorted(p.rsplit("/", 1)[1] for p in written) == sorted(
        [qa_decode.PREDICTIONS_FILE, qa_decode.NBEST_FILE, qa_decode.NULL_ODDS_FILE]
    )
    predictions = json.loads((tmp_path / qa_decode.PREDICTIONS_FILE).read_text())
    nbest = json.loads((tmp_path / qa_decode.NBEST_FILE).read_text())
    odds = json.loads((tmp_path / qa_decode.NULL_ODDS_FILE).read_text())
    assert predictions == {"q": "w5"}
    assert set(nbest["q"][0]) == {"text", "probability", "start_logit", "end_logit"}
    assert odds == {"q": pytest.approx(-2.0)}


# ----------------------------------------------------------------------------- scoring


def test_normalize_and_token_f1():
    assert qa_metrics.normalize_answer("The  Cat, sat!  an apple") == "cat sat apple"
    assert qa_metrics.exact_match("the Paris.", "paris") == 1.0
    assert qa_metrics.f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert qa_metrics.f1_score("", "") == 0.0
    assert qa_metrics.f1_score("", "", version_2=True) == 1.0
    assert qa_metrics.f1_score("x", "", version_2=True) == 0.0


def gold(qid, *texts):
    answers = tuple(qa.Answer(t, 0) for t in texts)
    return qa.QAExample(qid, "?", "", answers, is_impossible=not texts)


def test_evaluate_version_1():
    examples = [gold("1", "Paris", "paris city"), gold("2", "cat sat down"), gold("3", "x")]
    scores = qa_metrics.evaluate(examples, {"1": "the Paris", "2": "cat sat"}, version_2=False)
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * 1.8 / 3)


def test_evaluate_version_2_with_best_threshold():
    examples = [gold("1", "Paris"), gold("2"), gold("3", "blue sky"), gold("4")]
    predictions = {"1": "Paris", "2": "", "3": "sky", "4": "x"}
    odds = {"1": -2.0, "2": 1.0, "3": 0.5, "4": -1.0}
    scores = qa_metrics.evaluate(examples, predictions, version_2=True, null_odds=odds)
    assert scores["exact"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (2 + 2 / 3) / 4)
    assert scores["total"] == 4
    assert scores["HasAns_exact"] == pytest.approx(50.0)
    assert scores["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert scores["NoAns_exact"] == scores["NoAns_f1"] == pytest.approx(50.0)
    # Answering only question 1 (odds <= -2) scores 3 of 4.
    assert scores["best_exact"] == pytest.approx(75.0)
    assert scores["best_exact_thresh"] == -2.0
    assert scores["best_f1"] == pytest.approx(75.0)
    assert scores["best_f1_thresh"] == -2.0
    # Odds above na_prob_thresh count as "no answer".
    strict = qa_metrics.evaluate(
        examples, predictions, version_2=True, null_odds=odds, na_prob_thresh=0
    )
    assert strict["exact"] == pytest.approx(100 * 2 / 4)  # 1 and 2 right, 3 now wrong, 4 wrong
    assert strict["NoAns_exact"] == pytest.approx(50.0)


# ----------------------------------------------------------------------------- reading


SQUAD_V1 = {
    "version": "1.1",
    "data": [
        {
            "title": "T",
            "paragraphs": [
                {
                    "context": "The cat sat on the mat.",
                    "qas": [
                        {
                            "id": "a",
                            "question": "Who sat?",
                            "answers": [{"text": "The cat", "answer_start": 0}],
                        },
                        {
                            "id": "b",
                            "question": "Where?",
                            "answers": [{"text": "mat", "answer_start": 3}],  # wrong offset
                        },
                    ],
                }
            ],
        }
    ],
}


def test_read_squad_v1_reports_mismatched_answers(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(SQUAD_V1))
    data = qa.read_examples(path)
    assert not data.version_2
    assert [e.id for e in data.examples] == ["a", "b"]
    assert data.examples[0].answers == (qa.Answer("The cat", 0),)
    assert data.mismatched == ("b",)
    assert "1 answer(s) do not match" in data.report() and "b" in data.report()


def test_read_squad_v2_detects_the_task(tmp_path):
    squad = json.loads(json.dumps(SQUAD_V1))
    qas = squad["data"][0]["paragraphs"][0]["qas"]
    qas[1] = {
        "id": "c",
        "question": "Why?",
        "answers": [],
        "plausible_answers": [{"text": "mat", "answer_start": 19}],
        "is_impossible": True,
    }
    qas[0]["is_impossible"] = False
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(squad))
    data = qa.read_examples(path)
    assert data.version_2 and data.mismatched == ()
    assert data.examples[1].is_impossible and data.examples[1].answers == ()
    with pytest.raises(ValueError, match=r"qas\[1\]: question 'c' has no answer"):
        qa.read_examples(path, version_2_with_negative=False)


def test_read_json_lines(tmp_path):
    path = tmp_path / "train.jsonl"
    records = [
        {
            "id": "x",
            "question": "Who?",
            "context": "Ann met Bob.",
            "answers": {"text": ["Bob", "Bob."], "answer_start": [8, 8]},
        },
        {
            "id": "y",
            "question": "Why?",
            "context": "No reason.",
            "answers": {"text": [], "answer_start": []},
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = qa.read_examples(path)
    assert data.version_2
    assert data.examples[0].answers == (qa.Answer("Bob", 8), qa.Answer("Bob.", 8))
    assert data.examples[1].is_impossible


@pytest.mark.parametrize(
    "line, message",
    [
        (
            '{"question": "q", "answers": {"text": [], "answer_start": []}}',
            r"x\.jsonl line 2: missing 'context'",
        ),
        (
            '{"question": "q", "context": "c", "answers": {"text": ["c"], "answer_start": [-1]}}',
            r"x\.jsonl line 2: answers: answer_start=-1",
        ),
        (
            '{"question": "q", "context": "c", "answers": {"text": ["c"], "answer_start": []}}',
            r"x\.jsonl line 2: answers has 1 text",
        ),
        ("{not json", r"x\.jsonl line 2: not valid JSON"),
        (
            '{"id": "1", "question": "q", "context": "c", '
            '"answers": {"text": [], "answer_start": []}}',
            r"x\.jsonl line 2: id '1' was already used at .*x\.jsonl line 1",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_record(tmp_path, line, message):
    path = tmp_path / "x.jsonl"
    good = '{"question": "q", "context": "c", "answers": {"text": ["c"], "answer_start": [0]}}'
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        qa.read_examples(path)
    assert "\n" not in str(err.value)


def test_bad_squad_json_names_the_record(tmp_path):
    squad = json.loads(json.dumps(SQUAD_V1))
    del squad["data"][0]["paragraphs"][0]["qas"][1]["question"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(squad))
    with pytest.raises(
        ValueError, match=r"bad\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\]: missing 'question'"
    ):
        qa.read_examples(path)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="QASettings.doc_stride=0"):
        qa.QASettings(doc_stride=0)
    with pytest.raises(ValueError, match="QASettings.max_seq_length=60"):
        qa.QASettings(max_seq_length=60, max_query_length=64)


# ----------------------------------------------------------------------------- head and loss


def test_qa_sums_are_the_mean_of_start_and_end_cross_entropy():
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=(2, 3, 7)).astype(np.float32)
    starts, ends = np.array([1, 0, 6]), np.array([2, 0, 6])
    weights = np.array([1.0, 1.0, 0.0], np.float32)
    sums = qa_model.qa_sums(start, end, starts, ends, weights)

    def ce(x, y):
        return -(x[y] - np.log(np.sum(np.exp(x))))

    expected = sum(0.5 * (ce(start[i], starts[i]) + ce(end[i], ends[i])) for i in range(2))
    assert float(sums.loss) == pytest.approx(expected, rel=1e-5)
    assert float(sums.count) == 2.0
    hits = [(start[i].argmax() == starts[i]) & (end[i].argmax() == ends[i]) for i in range(2)]
    assert float(sums.correct) == sum(hits)
    # Halves add up to the whole, as micro-batches must.
    first = qa_model.qa_sums(start[:1], end[:1], starts[:1], ends[:1], weights[:1])
    second = qa_model.qa_sums(start[1:], end[1:], starts[1:], ends[1:], weights[1:])
    assert float(first.loss + second.loss) == pytest.approx(float(sums.loss), rel=1e-6)


def test_qa_sums_with_a_mask_ignore_the_padding_however_long():
    rng = np.random.default_rng(1)
    start, end = rng.normal(size=(2, 2, 5)).astype(np.float32)
    starts, ends = np.array([1, 4]), np.array([2, 4])
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    weights = np.ones(2, np.float32)
    sums = qa_model.qa_sums(start, end, starts, ends, weights, mask)
    # Row 0 as if it had been cut to its 3 real positions; row 1 has no padding.
    cut = qa_model.qa_sums(start[:1, :3], end[:1, :3], starts[:1], ends[:1], weights[:1])
    whole = qa_model.qa_sums(start[1:], end[1:], starts[1:], ends[1:], weights[1:])
    assert float(sums.loss) == pytest.approx(float(cut.loss + whole.loss), rel=1e-6)
    assert float(sums.correct) == float(cut.correct + whole.correct)
    # More padding changes nothing, whatever the logits there.
    padded = [np.concatenate([x, np.full((2, 3), 50.0, np.float32)], axis=1) for x in (start, end)]
    wider = qa_model.qa_sums(*padded, starts, ends, weights, np.pad(mask, ((0, 0), (0, 3))))
    assert float(wider.loss) == pytest.approx(float(sums.loss), rel=1e-6)


def test_head_parameters():
    model = qa_model.QuestionAnswering(CONFIG)
    shapes = nn.meta.unbox(jax.eval_shape(lambda: qa_model.init_params(model, jax.random.key(0))))
    assert set(shapes) == {"bert", qa_model.HEAD_NAME}
    assert shapes[qa_model.HEAD_NAME]["kernel"].shape == (CONFIG.hidden_size, 2)
    assert shapes[qa_model.HEAD_NAME]["bias"].shape == (2,)
    # google's init: truncated normal at initializer_range (cut at 2 sigma), zero bias.
    dense = qa_model.qa_outputs(BertConfig(hidden_size=512, num_heads=8))
    head = nn.meta.unbox(dense.init(jax.random.key(0), jnp.zeros((1, 1, 512)))["params"])
    kernel = np.asarray(head["kernel"])
    assert kernel.shape == (512, 2) and not np.any(np.asarray(head["bias"]))
    assert 0.015 < kernel.std() < 0.02 and np.abs(kernel).max() <= 0.04


# ----------------------------------------------------------------------------- answer()


def reference_answers(params, question, context, max_answer_len=15):
    """The pipeline's scoring, written out window by window from raw logits."""
    settings = qa.QASettings(max_seq_length=11, doc_stride=1, max_query_length=4)
    question_ids = TOKENIZER.encode(question)
    room = settings.max_seq_length - len(question_ids) - 3
    step = room - min(128, room // 2)
    ex = qa.QAExample("0", question, context, ())
    features = qa.make_features(
        [ex], TOKENIZER, dataclasses_replace(settings, step), training=False
    )
    starts, ends = window_logits(Model(CONFIG, params, TOKENIZER), features)
    found = {}
    for row in range(len(features)):
        context_tokens = np.flatnonzero(features.offsets[row, :, 0] != qa.NO_OFFSET)
        keep = np.concatenate([[0], context_tokens])
        p_start = np.exp(starts[row][keep]) / np.exp(starts[row][keep]).sum()
        p_end = np.exp(ends[row][keep]) / np.exp(ends[row][keep]).sum()
        for i, s in enumerate(context_tokens, start=1):
            for j, e in enumerate(context_tokens, start=1):
                if s <= e < s + max_answer_len:
                    span = (int(features.offsets[row, s, 0]), int(features.offsets[row, e, 1]))
                    found[span] = max(found.get(span, 0.0), p_start[i] * p_end[j])
    return sorted(found.items(), key=lambda item: -item[1])


def dataclasses_replace(settings, stride):
    return qa.QASettings(**{**vars(settings), "doc_stride": stride})


@pytest.mark.parametrize("context", ["w1 w2 w3", CONTEXT])  # one window, and three
def test_answer_scores_as_the_pipeline(context):
    params = random_params(seed=3)
    top = answering_model(CONFIG, params, TOKENIZER).answer(
        "q1 q2", context, top_k=3, max_seq_len=11
    )
    expected = reference_answers(params, "q1 q2", context)[:3]
    assert [(a["start"], a["end"]) for a in top] == [span for span, _ in expected]
    np.testing.assert_allclose([a["score"] for a in top], [s for _, s in expected], rtol=1e-5)
    for a in top:
        assert a["answer"] == context[a["start"] : a["end"]]
    one = answering_model(CONFIG, params, TOKENIZER).answer("q1 q2", context, max_seq_len=11)
    assert one == top[0]
    both = answering_model(CONFIG, params, TOKENIZER).answer(
        ["q1 q2", "q1"], [context, "the cat"], max_seq_len=11
    )
    # Batched with another question: the same span, the score up to float rounding.
    assert both[0]["answer"] == top[0]["answer"] and both[0]["start"] == top[0]["start"]
    assert both[0]["score"] == pytest.approx(top[0]["score"], rel=1e-5)
    assert both[1]["answer"] in ("the", "cat", "the cat")


def test_answer_with_impossible_answer():
    params = random_params(seed=3)
    answers = answering_model(CONFIG, params, TOKENIZER).answer(
        "q1",
        "w1 w2",
        top_k=10,
        handle_impossible_answer=True,
    )
    assert {a["answer"] for a in answers} == {"", "w1", "w2", "w1 w2"}
    assert sum(a["score"] for a in answers if a["answer"]) < 1.0


def test_answer_aligns_to_words():
    tokenizer = WordPieceTokenizer(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "caf", "##e", "##s", "cat"]
    )
    context = "the CAFES cat cafe"
    params = random_params(seed=4)
    kwargs = dict(top_k=20, max_answer_len=3)
    aligned = answering_model(CONFIG, params, tokenizer).answer("cat", context, **kwargs)
    words = {(0, 3), (4, 9), (10, 13), (14, 18)}
    starts, ends = {s for s, _ in words}, {e for _, e in words}
    assert all(a["start"] in starts and a["end"] in ends for a in aligned)
    raw = answering_model(CONFIG, params, tokenizer).answer(
        "cat", context, align_to_words=False, **kwargs
    )
    assert any(a["answer"] in ("CAF", "ES", "S", "caf", "e") for a in raw)
    assert len(raw) == len(
        {(s, e) for s in range(7) for e in range(s, min(s + 3, 7))}
    )  # 7 context tokens: every span of at most 3 of them


# ----------------------------------------------------------------------------- learning


def test_training_positions_point_at_the_answer_text():
    examples = synthetic_examples(np.random.default_rng(1), 200, impossible=0.2)
    settings = qa.QASettings(max_seq_length=12, doc_stride=3, max_query_length=4)
    features = qa.make_features(examples, TOKENIZER, settings, training=True)
    pointed = set()
    for row in range(len(features)):
        ex = examples[features.example_index[row]]
        s, e = features.start_positions[row], features.end_positions[row]
        if s == 0:
            assert e == 0
            continue
        assert not ex.is_impossible and features.input_mask[row, e]
        start, end = features.offsets[row, s, 0], features.offsets[row, e, 1]
        assert ex.context[start:end] == ex.answers[0].text
        pointed.add(ex.id)
    # Every one-word answer fits in some window; no unanswerable question points anywhere.
    assert pointed == {ex.id for ex in examples if not ex.is_impossible}


def test_reader_formats_by_content(tmp_path):
    record = {
        "question": "Who?",
        "context": "Ann.",
        "answers": {"text": ["Ann"], "answer_start": [0]},
    }
    one_line = tmp_path / "one.json"  # JSON Lines under a .json name
    one_line.write_text(json.dumps(record) + "\n")
    assert qa.read_examples(one_line).examples[0].answers == (qa.Answer("Ann", 0),)
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "data": [\n    {"paragraphs": []\n')
    with pytest.raises(ValueError, match=r"broken\.json line 4: not valid JSON \(.*column 1\)"):
        qa.read_examples(broken)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"data": []}))
    with pytest.raises(ValueError, match=r"empty\.json: holds no questions"):
        qa.read_examples(empty)
