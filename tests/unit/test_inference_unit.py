"""The unit tests of test_inference.py (tests/parity/), with the helpers both share."""

import warnings

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bertjax
from bertjax import inference
from bertjax.engine import perf
from bertjax.inference import InferenceError, Model, TruncationWarning, batching
from bertjax.nn import sharding as sharding_lib
from bertjax.pretrain import samples
from tests.helpers.inference import (  # noqa: F401 (fixtures)
    MASKED,
    TRAIN_STEPS,
    _assert_same_predictions,
    held_out,
    trained,
    workdir,
)


def test_load_workdir_latest_and_given_step(workdir, trained):
    latest = trained
    first = Model.load(workdir, step=TRAIN_STEPS // 2)
    assert latest.source.endswith(f"step {TRAIN_STEPS}") and first.source.endswith("step 20")
    config, params, tokenizer = bertjax.load(workdir)  # unchanged, and the same weights
    assert tokenizer.fingerprint == latest.tokenizer.fingerprint and config == latest.config
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(latest.params), params)
    words = latest.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert not np.array_equal(
        words, first.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    )
    with pytest.raises(InferenceError, match=r"step=7 is not a checkpoint.*\[20, 40\]"):
        Model.load(workdir, step=7)


def test_export_round_trips_back_into_bertjax(trained, held_out, tmp_path):
    model = trained
    model.save_hf(tmp_path)
    again = Model.load(tmp_path)
    assert again.tokenizer.fingerprint == model.tokenizer.fingerprint
    assert again.config.vocab_size == model.config.vocab_size
    jax.tree.map(
        np.testing.assert_array_equal, jax.device_get(again.params), jax.device_get(model.params)
    )
    _assert_same_predictions(again.fill_mask(MASKED), model.fill_mask(MASKED))
    texts = [*held_out, "a short text"]
    np.testing.assert_allclose(again.embed(texts), model.embed(texts), atol=1e-6, rtol=0)


def test_load_with_bfloat16_matmuls(workdir, trained, held_out):
    """Model.load(matmul_dtype=...): the products' operands rounded, the rest float32 (the
    embeddings move off float32's by bfloat16's resolution, not more); a dtype it does not
    know is said by name."""
    mixed = Model.load(workdir, matmul_dtype="bfloat16")
    assert mixed.run_config.matmul_dtype == "bfloat16" and mixed.run_config.dtype == "float32"
    assert mixed.config == trained.config  # what the checkpoint says is unchanged
    got, want = mixed.embed(held_out), trained.embed(held_out)
    assert got.dtype == np.float32
    error = np.abs(got - want).max()
    assert 0 < error < 0.02 * np.abs(want).max()
    with pytest.raises(InferenceError, match="matmul_dtype='int4'"):
        Model.load(workdir, matmul_dtype="int4")


def test_each_bucket_compiles_once(trained, held_out):
    model = Model(trained.config, trained.params, trained.tokenizer, batch_size=4)
    rng = np.random.default_rng(0)
    words = " ".join(held_out).split()
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 15, size=37)]
    compiled = inference._embed._cache_size()
    # A pooling of its own, so that other tests' compilations do not count here.
    vectors = model.embed(texts, pooling="cls", normalize=True)
    features = [e.features() for e in model.examples(texts, None, None)]
    buckets = set()  # (rows, length, packed length or None): one program each
    for rows in model.batcher.batches(features):
        shape = model.batcher.bucket(rows, features)
        mask = batching.pad_batch([features[r] for r in rows], shape)["input_mask"]
        buckets.add((shape["rows"], shape["length"], batching.fitted_packed_length(mask)))
    assert inference._embed._cache_size() - compiled == len(buckets)
    model.embed(list(reversed(texts)), pooling="cls", normalize=True)  # nothing new to compile
    assert inference._embed._cache_size() - compiled == len(buckets)
    # Sorting by length never mixes up which vector belongs to which text.
    for i in (0, 5, 36):
        alone = model.embed(texts[i], pooling="cls", normalize=True)
        np.testing.assert_allclose(vectors[i], alone[0], atol=1e-5, rtol=0)
    lengths = {b[1] for b in buckets}
    assert lengths <= {8, 16, 32, 64}


@settings(max_examples=30, deadline=None)
@given(
    shards=st.sampled_from((1, 2, 4)),
    rows_per_shard=st.sampled_from((1, 2, 8)),
    length=st.sampled_from((8, 64, 512)),
    data=st.data(),
)
def test_a_batch_runs_unpadded_where_packing_pays(shards, rows_per_shard, length, data):
    """The packed length holds the fullest shard's real tokens in whole eighths of its slots,
    and is chosen exactly when that is at most PACKING_MAX_SHARE of them."""
    rows = shards * rows_per_shard
    lengths = data.draw(st.lists(st.integers(0, length), min_size=rows, max_size=rows))
    lengths[0] = max(lengths[0], 1)  # a batch holds a text
    mask = (np.arange(length)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    slots = rows_per_shard * length
    fullest = max(sum(lengths[k : k + rows_per_shard]) for k in range(0, rows, rows_per_shard))
    step = slots // batching.PACKING_STEPS
    smallest = max(-(-fullest // step), 1) * step  # whole eighths holding the fullest shard
    packed = batching.fitted_packed_length(mask, shards)
    if smallest <= batching.PACKING_MAX_SHARE * slots:
        assert packed == smallest
    else:
        assert packed is None


def test_mesh_gives_the_same_results(workdir, trained, held_out):
    single = trained
    mesh = sharding_lib.make_mesh((2, 2, 2))
    spread = Model.load(workdir, mesh=mesh, batch_size=6)
    assert spread.batch_size == 8  # rows split evenly over data x fsdp = 4
    kernel = spread.params["bert"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
    assert not kernel.sharding.is_fully_replicated
    texts = held_out * 3
    np.testing.assert_allclose(spread.embed(texts), single.embed(texts), atol=1e-5, rtol=0)
    _assert_same_predictions(spread.fill_mask(MASKED), single.fill_mask(MASKED))
    # bertjax.make_mesh is the public name of that mesh; a mesh of other axes is refused,
    # naming them, before anything is placed.
    assert bertjax.make_mesh((-1, 1, 1)).axis_names == mesh.axis_names
    with pytest.raises(InferenceError, match=r"mesh: its axes are \('batch',\), bertjax's are"):
        Model.load(workdir, mesh=jax.make_mesh((8,), ("batch",)))


def test_progress_bar_only_on_long_calls(trained, held_out, capsys, monkeypatch):
    model = Model(trained.config, trained.params, trained.tokenizer, batch_size=4)
    monkeypatch.setattr(batching, "PROGRESS_MIN_TEXTS", 10)
    model.embed(held_out[:1] * 6)  # one text repeated: one batch shape to compile
    assert capsys.readouterr().err == ""
    model.embed(held_out[:1] * 12)
    assert "0/12 [" in capsys.readouterr().err  # a bar over the 12 texts


def test_bad_texts(trained):
    model = trained
    with pytest.raises(InferenceError, match=r"^the text is empty"):
        model.embed("")
    with pytest.raises(InferenceError, match=r"^text 1 is empty"):
        model.fill_mask(["a [MASK].", "   "])
    with pytest.raises(InferenceError, match=r"^the text has no \[MASK\]: write \[MASK\] where"):
        model.fill_mask("There is nothing to predict here.")
    with pytest.raises(InferenceError, match=r"text_or_texts\[1\] is of type int, not str"):
        model.fill_mask(["a [MASK]", 3])
    with pytest.raises(InferenceError, match="empty list"):
        model.embed([])
    with pytest.raises(InferenceError, match=r"pooling='max' is invalid"):
        model.embed("a", pooling="max")
    with pytest.raises(InferenceError, match=r"top_k=0 is invalid"):
        model.fill_mask("a [MASK]", top_k=0)
    with pytest.raises(InferenceError, match=r"max_length=200 is invalid: must be in \[3, 64\]"):
        model.encode("a", max_length=200)
    with pytest.raises(InferenceError, match=r"beyond the model's 64 positions"):
        model.fill_mask("word " * 80 + "[MASK].")
    # Too long: cut to the model's positions, with a warning naming the limit.
    with pytest.warns(TruncationWarning, match=r"the text is longer than the limit of 64 tokens"):
        result = model.fill_mask("[MASK] " + "word " * 80)
    assert len(result) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fill_mask("a short [MASK].")  # no warning when nothing is cut


def test_fill_mask_samples_for_the_demo(workdir, synthetic_data):
    config, params, tokenizer = bertjax.load(workdir)
    texts = samples.held_out_texts(synthetic_data, tokenizer, count=3)
    assert len(texts) == 3 and all(len(t.split()) >= 4 for t in texts)
    lines = samples.fill_mask_samples(config, params, tokenizer, texts + ["Give [MASK] here."])
    assert len(lines) == 4
    for line in lines[:3]:
        assert line.count("[MASK]") == 1 and "  ->  " in line and "(was: " in line
    assert "(was:" not in lines[3]
    # The hidden word is one the text had, and the line's guesses come from fill_mask.
    masked, rest = lines[0].split("  ->  ")
    answer = rest.rsplit("(was: ", 1)[1].rstrip(")")
    assert (
        masked.replace("[MASK]", answer).split()
        == tokenizer.decode(tokenizer.encode(texts[0])).split()
    )
    best = Model(config, params, tokenizer).fill_mask(masked)[0]
    shown = best["token_str"].strip() or tokenizer.id_to_piece(best["token"])  # "▁" by name
    assert rest.startswith(f"{shown} {best['score']:.2f}")


def test_on_cpu_long_texts_run_in_calls_within_the_token_budget(trained, held_out, monkeypatch):
    model = Model(trained.config, trained.params, trained.tokenizer, batch_size=8)
    rng = np.random.default_rng(1)
    words = " ".join(held_out).split()
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 20, size=20)]
    whole = model.embed(texts)
    monkeypatch.setattr(perf, "CPU_TOKENS_PER_CALL", 64)
    features = [e.features() for e in model.examples(texts, None, None)]
    shapes = [
        tuple(model.batcher.bucket(rows, features).values())
        for rows in model.batcher.batches(features)
    ]
    assert all(rows * length <= 64 for rows, length in shapes if rows > 1)
    assert {rows for rows, length in shapes if length == 32} == {2}
    assert sum(len(rows) for rows in model.batcher.batches(features)) == len(texts)
    np.testing.assert_allclose(model.embed(texts), whole, atol=1e-5, rtol=0)
