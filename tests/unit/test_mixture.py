"""Weighted mixtures: the data.sources syntax, the schedule's shares and caps, and the mixture
loader's determinism, resume and process split."""

import functools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax.data import TOKENIZER_SAMPLE_SENTENCES, prepare, train_mixture_tokenizer
from bertjax.data.corpus import ReadSettings
from bertjax.data.mixture import (
    BLOCK_EXAMPLES,
    Schedule,
    Source,
    SourcesError,
    apportion,
    make_mixture_loader,
    parse_sources,
)
from bertjax.data.storage import SplitReader, read_manifest
from bertjax.engine.settings import ConfigError
from bertjax.pretrain.data import SOURCES_DIR, ensure_sources
from bertjax.pretrain.settings import PretrainSettings
from bertjax.text.tokenizer import SENTENCEPIECE_FILE
from configs import tiny
from tests.helpers.corpora import write_random_corpus
from tests.helpers.loader_batches import assert_same, originals, take
from tests.helpers.mixture import format_sources

WEIGHTS = {"web": 0.6, "books": 0.3, "wiki": 0.1}


# Each source's words carry its own prefix.
_write_source_corpus = functools.partial(
    write_random_corpus,
    vocabulary=80,
    letters="abcdefgh",
    word_length=3,
    sentences=(2, 6),
    words=(4, 12),
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three prepared sources of different sizes sharing the first one's tokenizer."""
    root = tmp_path_factory.mktemp("mixture")
    prepared = []
    tokenizer = None
    for index, (name, weight) in enumerate(WEIGHTS.items()):
        corpus = _write_source_corpus(
            root / f"{name}.txt", 140 - 50 * index, seed=index, prefix=name[:2]
        )
        prepare(
            [str(corpus)],
            root / name,
            max_seq_length=32,
            max_predictions_per_seq=5,
            vocab_size=300,
            tokenizer_path=tokenizer,
            workers=1,
            eval_fraction=0.1,
            seed=1,
            verbose=False,
        )
        tokenizer = tokenizer or str(root / name / SENTENCEPIECE_FILE)
        prepared.append((Source(name, (str(corpus),), weight), str(root / name)))
    return prepared


def loader_of(prepared, **kwargs):
    kwargs = {"batch_size": 32, "seed": 3, "process_index": 0, "process_count": 1, **kwargs}
    return make_mixture_loader(prepared, log=lambda line: None, **kwargs)


# ----------------------------------------------------------------------------- data.sources


def test_sources_syntax_with_gcs_paths_globs_and_options():
    text = (
        "web=gs://b/fineweb/*.parquet:0.6, books=books/a.jsonl.zst|books/b.jsonl.zst:0.3:"
        "max_epochs=2,rp=gs://b/rp/year=2023/*.json.gz:0.1:text_field=raw_content:id_field=meta.id"
    )
    web, books, rp = parse_sources(text)
    assert web == Source("web", ("gs://b/fineweb/*.parquet",), 0.6)
    assert books.paths == ("books/a.jsonl.zst", "books/b.jsonl.zst") and books.max_epochs == 2
    assert rp.paths == ("gs://b/rp/year=2023/*.json.gz",)
    assert (rp.text_field, rp.id_field, rp.weight) == ("raw_content", "meta.id", 0.1)
    assert parse_sources(format_sources((web, books, rp))) == (web, books, rp)
    assert parse_sources("") == ()


@pytest.mark.parametrize(
    "text, message",
    [
        ("web=a.txt:0", r"source 'web': weight '0' is not a positive number; write name="),
        ("web=a.txt:-0.5", r"weight '-0.5' is not a positive number"),
        ("web=a.txt:heavy", r"weight 'heavy' is not a positive number"),
        ("web=a.txt:nan", r"weight 'nan' is not a positive number"),
        ("web=a.txt:inf", r"weight 'inf' is not a positive number"),
        ("web=a.txt", r"entry 'web=a.txt' is invalid: write name=path"),
        ("a.txt:0.5", r"entry 'a.txt:0.5' is invalid"),
        ("web=:0.5", r"source 'web' names no path"),
        ("w/b=a.txt:1", r"the name 'w/b' is invalid"),
        ("web=a:1,web=b:1", r"the name 'web' is given twice"),
        ("web=a:1:colour=red", r"source 'web': unknown option 'colour'; valid: format"),
        ("web=a:1:format=csv", r"source 'web': format='csv' is invalid"),
        ("web=a:1:max_epochs=0", r"source 'web': max_epochs must be a number > 0"),
        ("web=a:1:text_field=a..b", r"source 'web': text_field='a..b' is invalid"),
    ],
)
def test_bad_sources_are_one_line_errors(text, message):
    with pytest.raises(SourcesError, match=message) as err:
        parse_sources(text)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the schedule


def test_apportion_gives_largest_remainders():
    assert apportion(1000, [0.6, 0.3, 0.1]) == [600, 300, 100]
    assert apportion(1000, [1, 1, 1]) == [334, 333, 333]
    assert sum(apportion(1000, [0.123, 0.456, 7.0])) == 1000


@settings(max_examples=15, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 5.0), min_size=1, max_size=4),
    sizes=st.lists(st.integers(50, 3000), min_size=4, max_size=4),
    caps=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=4, max_size=4),
    seed=st.integers(0, 99),
)
def test_schedule_numbers_each_sources_examples_once_in_order_within_caps(
    weights, sizes, caps, seed
):
    count = len(weights)
    schedule = Schedule([f"s{i}" for i in range(count)], weights, sizes[:count], caps[:count], seed)
    total = schedule.total_examples
    n = 3 * BLOCK_EXAMPLES if total is None else total
    source, number = schedule.locate(np.arange(n))
    for s in range(count):
        numbers = number[source == s]
        # The k-th example drawn from a source is its number k: every number once, in order.
        np.testing.assert_array_equal(numbers, np.arange(len(numbers)))
        if caps[s]:
            assert len(numbers) <= int(caps[s] * sizes[s])
    np.testing.assert_array_equal(schedule.counts(n), np.bincount(source, minlength=count))
    half = n // 2 + 7
    np.testing.assert_array_equal(
        schedule.counts(half), np.bincount(source[:half], minlength=count)
    )
    # A batch's lookup (slices of the blocks) names the examples the general one does.
    everything = schedule.examples(np.arange(n))
    for first, size in ((0, n), (half, n - half), (BLOCK_EXAMPLES - 5, min(n, 2100) - 995)):
        for got, expected in zip(schedule.span(first, size), everything):
            np.testing.assert_array_equal(got, expected[first : first + size])


def test_every_window_of_a_batch_holds_each_source_in_its_share():
    schedule = Schedule(list(WEIGHTS), list(WEIGHTS.values()), [500, 300, 100], [0, 0, 0], 1)
    source, _ = schedule.locate(np.arange(4 * BLOCK_EXAMPLES))
    for start in range(0, len(source) - 32, 32):
        counts = np.bincount(source[start : start + 32], minlength=3)
        assert np.all(np.abs(counts - 32 * np.array([0.6, 0.3, 0.1])) <= 2), counts


# ----------------------------------------------------------------------------- the loader


def test_batches_realise_the_weights_within_one_percent(sources):
    loader = loader_of(sources)
    readers = [
        SplitReader(d, "train", read_manifest(d)["splits"]["train"]["shards"]) for _, d in sources
    ]
    batches = take(loader, 63)  # 2016 examples
    source, example = loader.schedule.examples(np.arange(63 * 32))
    for step, batch in enumerate(batches):  # each row is the example the schedule names
        rows = slice(step * 32, (step + 1) * 32)
        expected = np.stack(
            [
                readers[s].gather(np.array([e]), 32)["input_ids"][0]
                for s, e in zip(source[rows], example[rows])
            ]
        )
        np.testing.assert_array_equal(originals(batch), expected)
    shares = loader.shares()
    assert set(shares) == set(WEIGHTS)
    for name, weight in WEIGHTS.items():
        assert abs(shares[name] - weight) <= 0.01, shares
        assert abs(np.mean(source == list(WEIGHTS).index(name)) - shares[name]) < 1e-12
    # Each source is read in passes of its own shuffled order, none of them exhausted here.
    assert len(readers[2]) < np.sum(source == 2)


def test_mixture_resumes_mid_pass_with_identical_batches(sources):
    loader = loader_of(sources)
    batches = take(loader, 7)
    state = json.loads(json.dumps(loader.get_state()))
    batches += take(loader, 5)
    fresh = loader_of(sources)
    fresh.set_state(state)
    assert_same(take(fresh, 5), batches[7:])
    assert fresh.shares() == loader.shares()
    changed = [(source.__class__(**{**source.__dict__, "weight": 0.5}), d) for source, d in sources]
    with pytest.raises(ValueError, match="this mixture has sources=") as err:
        loader_of(changed).set_state(state)
    assert "start a new phase to change them" in str(err.value)


def test_mixture_batches_do_not_depend_on_the_process_count(sources):
    whole = loader_of(sources, batch_size=16)
    halves = [loader_of(sources, batch_size=8, process_index=p, process_count=2) for p in range(2)]
    for _ in range(6):
        batch = next(whole)
        first, second = next(halves[0]), next(halves[1])
        for name, value in batch.items():
            np.testing.assert_array_equal(np.concatenate([first[name], second[name]]), value)


def test_a_source_at_its_cap_drops_out_and_the_mixture_renormalises(sources):
    capped = [
        (Source(s.name, s.paths, s.weight, max_epochs=1.0 if s.name == "books" else 0.0), d)
        for s, d in sources
    ]
    lines = []
    loader = make_mixture_loader(
        capped, batch_size=50, seed=3, process_index=0, process_count=1, log=lines.append
    )
    books = len(
        SplitReader(capped[1][1], "train", read_manifest(capped[1][1])["splits"]["train"]["shards"])
    )
    # books fills 300 of each block's 1000 examples; the block it runs short in takes the rest.
    ran_out = math.ceil(books / 300) * BLOCK_EXAMPLES
    take(loader, ran_out // 50)
    assert lines == []
    take(loader, 1)
    assert lines == [
        f"mixture: 'books' (max_epochs=1, {books} examples) ran out at example "
        f"{ran_out}; renormalised to web 0.857, wiki 0.143"
    ]
    source, example = loader.schedule.examples(np.arange(ran_out + 2 * BLOCK_EXAMPLES))
    assert np.sum(source == 1) == books == len(set(example[source == 1]))  # each once
    assert np.all(source[ran_out:] != 1)
    full_blocks = ran_out // BLOCK_EXAMPLES - 1
    assert np.sum(source[: full_blocks * BLOCK_EXAMPLES] == 1) == 300 * full_blocks


def test_all_sources_capped_make_a_finite_run(sources):
    capped = [(Source(s.name, s.paths, s.weight, max_epochs=2.0), d) for s, d in sources]
    loader = loader_of(capped)
    assert loader.schedule.total_examples is not None
    assert loader.num_steps == loader.schedule.total_examples // 32
    assert loader.schedule.total_examples == 2 * loader.num_examples
    batches = list(loader)
    assert len(batches) == loader.num_steps
    with pytest.raises(ValueError, match="fewer than one global batch"):
        loader_of([(Source("x", ("x",), 1.0, max_epochs=0.01), sources[0][1])])


def test_sources_must_share_the_tokenizer_and_sequence_length(sources, tmp_path):
    corpus = _write_source_corpus(tmp_path / "other.txt", 60, seed=9, prefix="zz")
    prepare(
        [str(corpus)],
        tmp_path / "other",
        max_seq_length=32,
        vocab_size=300,
        workers=1,
        eval_fraction=0.1,
        verbose=False,
    )
    with pytest.raises(ValueError, match=r"source 'other' \(.*\) was prepared with tokenizer="):
        loader_of([sources[0], (Source("other", (str(corpus),), 1.0), str(tmp_path / "other"))])


# ----------------------------------------------------------------------------- settings


def settings_with(**data):
    config = tiny.get_config()
    config.data.update(data)
    return PretrainSettings.from_config(config)


def test_data_sources_setting_is_read_into_typed_sources(sources):
    text = format_sources(tuple(source for source, _ in sources))
    settings = settings_with(sources=text)
    assert tuple(s.name for s in settings.data.sources) == tuple(WEIGHTS)
    assert settings.data.sources[0].weight == 0.6 and settings.data.inputs == ()


@pytest.mark.parametrize(
    "text, message",
    [
        ("web={corpus}:0", r"config.data.sources: source 'web': weight '0' is not a positive"),
        ("web={corpus}:-1", r"weight '-1' is not a positive number"),
        ("web={missing}:1", r"config.data.sources: source 'web': input path .* does not exist"),
        ("web={empty}:1", r"source 'web': input directory .* contains no files"),
        ("web={corpus}*.none:1", r"source 'web': input glob .* matches no files"),
    ],
)
def test_bad_sources_fail_in_one_line_naming_the_source(sources, tmp_path, text, message):
    (tmp_path / "empty").mkdir()
    corpus = sources[0][0].paths[0]
    text = text.format(corpus=corpus, missing=tmp_path / "nope.txt", empty=tmp_path / "empty")
    with pytest.raises(ConfigError, match=message) as err:
        settings_with(sources=text)
    assert "\n" not in str(err.value)


def test_sources_and_input_are_not_both_set(sources):
    corpus = sources[0][0].paths[0]
    with pytest.raises(ConfigError, match=r"config.data.sources=.* and data.input are both set"):
        settings_with(sources=f"web={corpus}:1", input=corpus)


def test_an_empty_source_fails_naming_it_and_leaves_the_prepared_ones(sources, tmp_path):
    (tmp_path / "blank.jsonl").write_text('{"text": "   "}\n\n')
    corpus = sources[0][0].paths[0]
    common = dict(vocab_size=300, max_seq_length=32, max_predictions_per_seq=5)
    common.update(eval_fraction=0.1, dupe_factor=1)
    mixture = f"web={corpus}:0.9,blank={tmp_path / 'blank.jsonl'}:0.1"
    # Training the mixture's tokenizer reads every source: the empty one fails first, and
    # nothing is written.
    settings = settings_with(sources=mixture, **common)
    with pytest.raises(ValueError, match=r"sources: training their tokenizer: source 'blank': "):
        ensure_sources(settings.data, tmp_path / "run", eval_batch_size=4, seed=0)
    assert not list((tmp_path / "run" / "data" / SOURCES_DIR).glob("*"))
    # With the tokenizer given, the sources before it are prepared and stay prepared.
    tokenizer = str(sources[0][1] + "/" + SENTENCEPIECE_FILE)
    settings = settings_with(sources=mixture, tokenizer=tokenizer, **common)
    with pytest.raises(ValueError, match=r"config.data.sources: source 'blank': input .* holds "):
        ensure_sources(settings.data, tmp_path / "run", eval_batch_size=4, seed=0)
    (web,) = (tmp_path / "run" / "data" / SOURCES_DIR).glob("web-*")
    before = (web / "manifest.json").stat().st_mtime_ns
    with pytest.raises(ValueError, match="source 'blank'"):
        ensure_sources(settings.data, tmp_path / "run", eval_batch_size=4, seed=0)
    assert (web / "manifest.json").stat().st_mtime_ns == before  # reused, not prepared again


def test_a_mixtures_tokenizer_is_trained_on_every_source_deterministically(tmp_path):
    # Two corpora that share no letter: a tokenizer of the first alone spells the second's
    # words in byte-fallback pieces.
    latin = _write_source_corpus(tmp_path / "latin.txt", 60, seed=1)
    other = tmp_path / "other.txt"
    other.write_text(latin.read_text().translate(str.maketrans("abcdefgh", "stuvwxyz")))
    settings = settings_with(
        sources=f"big={latin}:0.95,small={other}:0.05",
        vocab_size=320,
        max_seq_length=32,
        max_predictions_per_seq=5,
        eval_fraction=0.1,
        dupe_factor=1,
    )
    prepared, tokenizer = ensure_sources(settings.data, tmp_path / "run", eval_batch_size=4, seed=0)
    root = tmp_path / "run" / "data" / SOURCES_DIR
    (trained,) = root.glob("tokenizer-*.model")
    assert all(
        read_manifest(p.dir)["tokenizer_fingerprint"] == tokenizer.fingerprint for p in prepared
    )
    words = other.read_text().split()[:50]
    pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode(" ".join(words))]
    assert not any(piece.startswith("<0x") for piece in pieces), pieces  # no byte fallback
    # The same sources in another order and weights: the same sample, the same tokenizer,
    # found where the first run trained it (and the prepared sources reused).
    again = settings_with(
        sources=f"small={other}:0.5,big={latin}:0.5",
        vocab_size=320,
        max_seq_length=32,
        max_predictions_per_seq=5,
        eval_fraction=0.1,
        dupe_factor=1,
    )
    reused, same = ensure_sources(again.data, tmp_path / "run", eval_batch_size=4, seed=0)
    assert same.fingerprint == tokenizer.fingerprint and all(p.reused for p in reused)
    # Trained afresh from the same sources: byte for byte the same model.
    retrained = train_mixture_tokenizer(
        [("big", [str(latin)], ReadSettings()), ("small", [str(other)], ReadSettings())],
        tmp_path / "retrained.model",
        vocab_size=320,
        sample_sentences=TOKENIZER_SAMPLE_SENTENCES,
        seed=0,
        log=lambda line: None,
    )
    assert (tmp_path / "retrained.model").read_bytes() == trained.read_bytes()
    assert retrained.fingerprint == tokenizer.fingerprint
