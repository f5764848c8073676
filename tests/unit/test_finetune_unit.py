"""The unit tests of test_finetune.py (tests/integration/), with their helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import optim, perf, steps
from bertjax.finetune import batches as batches_lib
from bertjax.finetune import evaluation
from bertjax.finetune import widths as widths_lib
from bertjax.finetune.objective import build_finetuning
from bertjax.finetune.task import Examples
from bertjax.nn import unpadding
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.qa import model as qa_model


def assert_trained_the_same(first, second):
    """Two (loss or losses, updated params) results agree: losses to 1e-5, params to 1e-4."""
    (loss_a, params_a), (loss_b, params_b) = first, second
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params_a, params_b
    )


def small_config(positions: int) -> BertConfig:
    """A one-layer BERT without dropout, for exact comparisons of train steps."""
    return BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        intermediate_size=64,
        max_position_embeddings=positions,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _uneven_examples(task: str, count: int, seq: int, longest: int, seed: int = 0) -> Examples:
    """Examples of lengths 3 to `longest` for a label task or question answering."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, longest + 1, size=count)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    features = {
        "input_ids": (rng.integers(5, 64, size=(count, seq)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((count, seq), np.int32),
    }
    word_positions = None
    if task == qa_model.TASK:
        starts = (rng.random(count) * (lengths - 1)).astype(np.int32)
        features["start_positions"] = starts
        features["end_positions"] = np.minimum(starts + 1, lengths - 1).astype(np.int32)
    elif task == label_heads.TOKEN_CLASSIFICATION:
        labels = np.where(
            mask == 1, rng.integers(0, 3, size=(count, seq)), label_heads.IGNORE_LABEL
        )
        features["labels"] = labels.astype(np.int32)
        word_positions = [np.arange(n) for n in lengths]
    else:
        features["labels"] = rng.integers(0, 3, size=count).astype(np.int32)
    return Examples(
        "train", "synthetic", features, [str(i) for i in range(count)], True, word_positions
    )


def _head(task: str) -> HeadSpec:
    return HeadSpec(task, qa_model.HEAD_LABELS if task == qa_model.TASK else ("a", "b", "c"))


def test_sharded_steps_equal_data_parallel_ones():
    config = small_config(16)
    head = HeadSpec(label_heads.CLASSIFICATION, ("a", "b", "c"))
    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(5, 64, size=(16, 16)).astype(np.int32),
        "input_mask": np.ones((16, 16), np.int32),
        "segment_ids": np.zeros((16, 16), np.int32),
        "labels": rng.integers(0, 3, size=16).astype(np.int32),
        "weights": np.ones(16, np.float32),
    }
    results = []
    # Data parallel; then FSDP x tensor x data with two accumulated micro-batches.
    for mesh_shape, accumulate in (((8, 1, 1), 1), ((2, 2, 2), 2)):
        ft = build_finetuning(
            config,
            head,
            optimizer,
            mesh_shape=mesh_shape,
            grad_accum_steps=accumulate,
            micro_batch_size=16 // accumulate,
            max_seq_length=16,
        )
        with jax.set_mesh(ft.mesh):
            state = ft.state.init(jax.random.key(0))
            losses = []
            for _ in range(2):
                global_batch = steps.global_batch(batch, ft.batch_sharding, 1)
                state, metrics = ft.train_step(state, global_batch, jax.random.key(1))
                losses.append(float(metrics["train/loss"]))
            results.append((losses, jax.device_get(state.params)))
        if mesh_shape == (2, 2, 2):
            kernel = ft.state.shardings.params["classifier"]["kernel"]
            assert kernel.spec == jax.sharding.PartitionSpec("fsdp", None)
    assert_trained_the_same(*results)


@pytest.mark.parametrize("task", [label_heads.CLASSIFICATION, label_heads.TOKEN_CLASSIFICATION])
def test_length_buckets_cut_only_padding_and_train_the_same(task):
    config = small_config(32)
    head = HeadSpec(task, ("a", "b", "c"))
    rng = np.random.default_rng(0)
    count, seq = 16, 32
    lengths = rng.integers(3, 14, size=count)  # the longest, 13 or less, fits 16 positions
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    labels = rng.integers(0, 3, size=count).astype(np.int32)
    if task == label_heads.TOKEN_CLASSIFICATION:
        labels = np.where(
            mask == 1, rng.integers(0, 3, size=(count, seq)), label_heads.IGNORE_LABEL
        )
    features = {
        "input_ids": (rng.integers(5, 64, size=(count, seq)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((count, seq), np.int32),
        "labels": labels.astype(np.int32),
    }
    word_positions = (
        [np.arange(n) for n in lengths] if task == label_heads.TOKEN_CLASSIFICATION else None
    )
    examples = Examples(
        "train", "synthetic", features, [str(i) for i in range(count)], True, word_positions
    )
    order = batches_lib.epoch_order(0, 0, count)
    full = batches_lib.train_batch(examples, order, 0, count)
    cut = batches_lib.train_batch(examples, order, 0, count, length_bucket=8)
    assert full["input_ids"].shape == (count, seq)
    assert cut["input_ids"].shape == cut["input_mask"].shape == (count, 16)
    assert cut["labels"].shape == ((count, 16) if word_positions else (count,))
    assert cut["input_mask"].sum() == full["input_mask"].sum()  # only padding was cut

    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    # Packing slots (half of 32 positions) that the full batch packs into and the cut one,
    # with no more positions than that, runs without. Told that every batch fits (as a run
    # whose capacity comes from its data is), the full batch's step packs without the
    # conditional: one gradient in its program instead of two, the same update.
    results, conditionals = [], []
    for every_batch_fits in (False, True):
        ft = build_finetuning(
            config,
            head,
            optimizer,
            mesh_shape=(8, 1, 1),
            grad_accum_steps=1,
            micro_batch_size=count,
            max_seq_length=seq,
            token_capacity=0.5,
            every_batch_fits=every_batch_fits,
        )
        with jax.set_mesh(ft.mesh):
            for batch in (full, cut) if not every_batch_fits else (full,):
                state = ft.state.init(jax.random.key(0))
                global_batch = steps.global_batch(batch, ft.batch_sharding, 1)
                program = ft.train_step.lower(state, global_batch, jax.random.key(1)).as_text()
                conditionals.append(program.count("stablehlo.case"))
                state, metrics = ft.train_step(state, global_batch, jax.random.key(1))
                assert float(metrics["train/packed"]) == 1.0
                results.append((float(metrics["train/loss"]), jax.device_get(state.params)))
    for other in results[1:]:
        assert_trained_the_same(results[0], other)
    # (full, cut, full told that every batch fits): only the first chooses between packing
    # and not (the others keep the step's one conditional, on a non-finite update).
    full_choosing, cut_unpacked, full_packed = conditionals
    assert full_choosing == cut_unpacked + 1 == full_packed + 1


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(1, 300),
    batch_size=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3),
    longest=st.integers(1, 40),
)
def test_batches_by_length_hold_the_shuffled_epochs_examples_with_less_padding(
    count, batch_size, seed, epoch, longest
):
    steps_per_epoch = count // batch_size
    lengths = np.random.default_rng(seed).integers(1, longest + 1, size=count)
    shuffled = batches_lib.epoch_order(seed, epoch, count)
    assert sorted(shuffled) == list(range(count))  # the shuffled order, as ever: a permutation
    order = batches_lib.epoch_order(seed, epoch, count, lengths, batch_size)
    np.testing.assert_array_equal(
        order, batches_lib.epoch_order(seed, epoch, count, lengths, batch_size)
    )
    kept = shuffled[: steps_per_epoch * batch_size]
    # The examples of the shuffled epoch's whole batches, each once: the same ones dropped.
    assert sorted(order) == sorted(kept)
    if steps_per_epoch == 0:
        return
    window = {
        int(e): i // (batches_lib.LENGTH_WINDOW_BATCHES * batch_size) for i, e in enumerate(kept)
    }
    batches = order.reshape(steps_per_epoch, batch_size)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for batch in batches:
        windows = {window[int(e)] for e in batch}
        assert len(windows) == 1  # a batch is cut from one window of the random order
        ranges.setdefault(windows.pop(), []).append((lengths[batch].min(), lengths[batch].max()))
    for spans in ranges.values():  # within a window, batches of adjacent lengths
        spans.sort()
        assert all(high <= low for (_, high), (low, _) in zip(spans, spans[1:]))
    # Each batch padded to its longest: never more positions than the shuffled batches.
    padded = lengths[batches].max(axis=1).sum()
    assert padded <= lengths[kept.reshape(steps_per_epoch, batch_size)].max(axis=1).sum()


def test_evaluation_takes_fewer_widths_where_a_program_costs_more_than_it_saves():
    examples = _uneven_examples(label_heads.CLASSIFICATION, 60, 128, longest=128, seed=4)
    dev, test = examples, Examples("test", "synthetic", examples.features, examples.indices, False)
    free = widths_lib.evaluation_widths([dev, test], 32)
    assert len(free) > 2
    counts = []
    for cost in (0, 100, 1_000, 10**9):
        widths = widths_lib.evaluation_widths(
            [dev, test], 32, passes=[3, 1], program_positions=cost
        )
        assert set(widths) <= set(free) and max(widths) == max(free)
        counts.append(len(widths))
    assert counts[0] == len(free) and counts == sorted(counts, reverse=True) and counts[-1] == 1
    # Passes weigh the positions a width saves: three passes of a split save three times.
    for cost in (100, 1_000):
        assert widths_lib.evaluation_widths(
            [dev], 32, passes=[3], program_positions=cost
        ) == widths_lib.evaluation_widths([dev], 32, program_positions=cost / 3)


def test_batches_by_length_come_in_a_shuffled_order_that_changes_each_epoch():
    count, batch_size = 640, 16  # 40 batches, one window
    lengths = np.random.default_rng(0).integers(1, 200, size=count)
    longest = [
        lengths[batches_lib.epoch_order(0, epoch, count, lengths, batch_size)]
        .reshape(-1, batch_size)
        .max(axis=1)
        for epoch in range(2)
    ]
    for per_batch in longest:  # not from long to short (nor back)
        assert not np.all(np.diff(per_batch) <= 0) and not np.all(np.diff(per_batch) >= 0)
    assert not np.array_equal(*longest)
    with pytest.raises(ValueError, match="639 lengths for 640 examples"):
        batches_lib.epoch_order(0, 0, count, lengths[1:], batch_size)


@pytest.mark.parametrize(
    "shards, accumulate, batch_order", [(1, 1, "shuffled"), (4, 2, "shuffled"), (4, 2, "by_length")]
)
def test_the_capacity_chosen_from_the_data_fits_every_batch_exactly(
    shards, accumulate, batch_order
):
    rng = np.random.default_rng(3)
    count, seq, batch_size = 100, 24, 16
    lengths = rng.integers(3, seq + 1, size=count)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    features = {"input_mask": mask, "labels": np.zeros(count, np.int32)}
    examples = Examples("train", "synthetic", features, [""] * count, True)
    seeds, epochs = (1, 2), 3
    capacity = widths_lib.fitting_capacity(
        examples, seeds, epochs, batch_size, accumulate, shards, batch_order
    )
    slots = batch_size // accumulate // shards * seq
    # What the train step counts: real tokens per batch shard of every micro-batch.
    fullest = 0
    for seed in seeds:
        for epoch in range(epochs):
            order = batches_lib.training_order(examples, seed, epoch, batch_size, batch_order)
            for index in range(count // batch_size):
                rows = order[index * batch_size : (index + 1) * batch_size]
                for micro in steps.split_micro_batches(mask[rows], accumulate):
                    per_shard = unpadding.tokens_per_group(jnp.asarray(micro), shards)
                    fullest = max(fullest, int(per_shard.max()))
    assert fullest == round(capacity * slots)
    # By length, the longest batch's rows are the data's longest: they may fill every slot.
    assert 0 < capacity < 1 if batch_order == "shuffled" else 0 < capacity <= 1


@pytest.mark.parametrize(
    "task", [label_heads.CLASSIFICATION, label_heads.TOKEN_CLASSIFICATION, qa_model.TASK]
)
def test_micro_batches_grouped_by_length_take_the_one_batch_update(task):
    count, seq, groups = 32, 24, 4  # micro-batches of widths 8, 16 and 24
    examples = _uneven_examples(task, count, seq, longest=seq - 1)
    order = batches_lib.epoch_order(0, 0, count)
    lengths = examples.features["input_mask"].sum(axis=1)
    micro_batches = batches_lib.train_micro_batches(
        examples, order, 0, count, groups, length_bucket=8
    )
    # Every example once, the shortest together, each micro-batch cut to its own bucket.
    held = [micro["input_mask"].sum(axis=1) for micro in micro_batches]
    assert sorted(np.concatenate(held)) == sorted(lengths)
    assert all(a.max() <= b.min() for a, b in zip(held, held[1:]))
    for micro, real in zip(micro_batches, held):
        assert micro["input_ids"].shape == (count // groups, -(-real.max() // 8) * 8)
    assert len({micro["input_ids"].shape for micro in micro_batches}) > 1

    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    results = []
    for accumulate in (1, groups):
        ft = build_finetuning(
            small_config(seq),
            _head(task),
            optimizer,
            mesh_shape=(8, 1, 1),
            grad_accum_steps=accumulate,
            micro_batch_size=count // accumulate,
            max_seq_length=seq,
        )
        with jax.set_mesh(ft.mesh):
            state = ft.state.init(jax.random.key(0))
            losses = []
            for _ in range(2):  # the second step starts from the first's optimizer state
                if accumulate == 1:
                    batch = batches_lib.train_batch(examples, order, 0, count)
                else:
                    batch = micro_batches
                state, metrics = ft.steps.take_step(state, batch, jax.random.key(1))
                losses.append(float(metrics["train/loss"]))
            if accumulate > 1:  # one program per width, whichever micro-batches meet it
                widths = {micro["input_ids"].shape[1] for micro in micro_batches}
                assert ft.steps.micro_batch_step.accumulate._cache_size() == len(widths)
            params = jax.device_get(state.params)
            if task == qa_model.TASK:
                # The start and end biases' gradient is zero (a softmax's probabilities sum
                # to one): Adam scales its float noise up to updates of about lr / 100.
                del params[qa_model.HEAD_NAME]["bias"]
            results.append((losses, params))
    assert_trained_the_same(*results)


def test_the_runs_training_widths_are_few_and_hold_every_micro_batch():
    count, seq, batch_size, groups = 96, 64, 16, 4
    examples = _uneven_examples(label_heads.CLASSIFICATION, count, seq, longest=seq, seed=2)
    seeds, epochs = (1, 2), 2
    widths = widths_lib.training_widths(
        examples, seeds, epochs, batch_size, groups, 8, overhead=0.1, program_positions=0
    )
    assert widths_lib.training_widths(examples, seeds, epochs, batch_size, groups, 0) is None
    assert all(w % 8 == 0 for w in widths)
    buckets, positions, bucket_positions = set(), 0, 0
    for seed in seeds:
        for epoch in range(epochs):
            order = batches_lib.epoch_order(seed, epoch, count)
            for index in range(count // batch_size):
                cut = batches_lib.train_micro_batches(examples, order, index, batch_size, groups, 8)
                held = batches_lib.train_micro_batches(
                    examples, order, index, batch_size, groups, 8, widths
                )
                for a, b in zip(cut, held):
                    np.testing.assert_array_equal(a["labels"], b["labels"])  # the same rows
                    longest, width = a["input_mask"].sum(axis=1).max(), b["input_ids"].shape[1]
                    # The narrowest of the run's widths that holds the micro-batch.
                    assert width == min(w for w in widths if w >= longest)
                    np.testing.assert_array_equal(
                        b["input_ids"][:, : a["input_ids"].shape[1]], a["input_ids"]
                    )
                    buckets.add(a["input_ids"].shape[1])
                    positions += b["input_ids"].size
                    bucket_positions += a["input_ids"].size
    assert len(widths) < len(buckets)
    assert bucket_positions <= positions <= 1.1 * bucket_positions


def test_training_widths_weigh_what_a_program_costs_in_positions():
    count, seq, batch_size, groups = 96, 64, 16, 4
    examples = _uneven_examples(label_heads.CLASSIFICATION, count, seq, longest=seq, seed=2)
    seeds, epochs = (1, 2), 2

    def widths(program_positions):
        return widths_lib.training_widths(
            examples, seeds, epochs, batch_size, groups, 8, 0.0, "shuffled", program_positions
        )

    def positions(run_widths):  # trained over the run, every row of every micro-batch
        total = 0
        for seed in seeds:
            for epoch in range(epochs):
                order = batches_lib.epoch_order(seed, epoch, count)
                for index in range(count // batch_size):
                    total += sum(
                        b["input_ids"].size
                        for b in batches_lib.train_micro_batches(
                            examples, order, index, batch_size, groups, 8, run_widths
                        )
                    )
        return total

    finest = widths(0)  # every width that saves a position
    saved = positions((seq,)) - positions(finest)
    assert len(finest) > 2 and saved > 0
    assert widths(saved + 1) == (seq,)  # no width saves what a program costs
    # A program worth half of what all the widths save: some width saves more (positions
    # count every row of a micro-batch, not one per micro-batch), not every one does.
    halfway = widths(saved / 2)
    assert 1 < len(halfway) < len(finest)
    assert positions(halfway) < positions((seq,)) - saved / 2


def _evaluation_setup(task: str, seq: int, devices):
    """A task's fine-tuning steps to evaluate with: batches of 8 split over `devices`."""
    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    return build_finetuning(
        small_config(seq),
        _head(task),
        optimizer,
        mesh_shape=(len(devices), 1, 1),
        grad_accum_steps=1,
        micro_batch_size=8,
        max_seq_length=seq,
        devices=devices,
    )


@pytest.mark.parametrize(
    "task", [label_heads.CLASSIFICATION, label_heads.TOKEN_CLASSIFICATION, qa_model.TASK]
)
def test_evaluation_grouped_by_length_gives_every_example_its_full_length_outputs(task):
    count, seq = 21, 48  # the last batch of 8 is part filler
    examples = _uneven_examples(task, count, seq, longest=30, seed=1)
    ft = _evaluation_setup(task, seq, jax.devices())
    with jax.set_mesh(ft.mesh):
        params = ft.state.init(jax.random.key(0)).params
        sums, outputs = evaluation.run_eval(ft, params, examples, 8, length_bucket=8)
        # The reference: every example at full length, in order, in one batch.
        batch = dict(examples.features, weights=np.ones(count, np.float32))
        batch = {k: np.concatenate([v, v[:3]]) for k, v in batch.items()}  # 24 rows
        batch["weights"][count:] = 0.0
        if examples.word_positions is not None:  # token labels count unless ignored
            batch["labels"][count:] = label_heads.IGNORE_LABEL
        expected_sums, expected = ft.eval_step(
            params, steps.global_batch(batch, ft.batch_sharding, 1)
        )
    expected = {k: np.asarray(v)[:count] for k, v in expected.items()}
    assert set(outputs) == set(expected)
    lengths = examples.features["input_mask"].sum(axis=1)
    never_read = -(-lengths.max() // 8) * 8  # no batch keeps positions from here on
    assert never_read < seq
    for name, value in outputs.items():
        assert value.shape == expected[name].shape
        if name in ft.objective.position_outputs:
            for row, n in enumerate(lengths):  # at real positions the outputs agree
                np.testing.assert_allclose(value[row, :n], expected[name][row, :n], atol=1e-5)
            lowest = np.finfo if value.dtype.kind == "f" else np.iinfo
            assert (value[:, never_read:] == lowest(value.dtype).min).all()
        else:
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5),
        sums,
        jax.device_get(expected_sums),
    )


def test_evaluation_on_cpu_cuts_long_batches_into_calls_within_the_token_budget(monkeypatch):
    task = qa_model.TASK
    count, seq = 21, 32
    examples = _uneven_examples(task, count, seq, longest=24, seed=1)
    ft = _evaluation_setup(task, seq, jax.devices()[:2])
    with jax.set_mesh(ft.mesh):
        params = ft.state.init(jax.random.key(0)).params
        sums, outputs = evaluation.run_eval(ft, params, examples, 8, length_bucket=8)
        assert {len(real) for real, _ in batches_lib.eval_batches(examples, 8, 8, 2, "cpu")} == {
            8,
            5,
        }
        # 16 tokens per device: batches of width 8 hold 4 rows, of 16 and more 2 rows.
        monkeypatch.setattr(perf, "CPU_TOKENS_PER_CALL", 16)
        sizes = [
            (len(local["input_ids"]), local["input_ids"].shape[1])
            for _, local in batches_lib.eval_batches(examples, 8, 8, 2, "cpu")
        ]
        assert {rows for rows, width in sizes if width >= 16} == {2}
        assert sum(rows for rows, _ in sizes) >= count
        # On an accelerator the batches stay whole.
        assert {len(real) for real, _ in batches_lib.eval_batches(examples, 8, 8, 2, "gpu")} == {
            8,
            5,
        }
        cut_sums, cut = evaluation.run_eval(ft, params, examples, 8, length_bucket=8)
        # The run's few widths: each batch at one of them, all rows it can hold but the last.
        widths = widths_lib.evaluation_widths([examples], 32, overhead=0.5)  # multiples of 8
        shapes = [
            (len(real), local["input_ids"].shape)
            for real, local in batches_lib.eval_batches(examples, 8, 8, 2, "cpu", widths)
        ]
        assert {shape for _, shape in shapes} <= {(perf.rows_per_call(w, 8, 2), w) for w in widths}
        assert [real < shape[0] for real, shape in shapes].count(True) <= 1
        assert sum(real for real, _ in shapes) == count
        assert len(widths) < len({shape for _, shape in sizes})
        few_sums, few = evaluation.run_eval(
            ft, params, examples, 8, length_bucket=32, widths=widths
        )
    lengths = examples.features["input_mask"].sum(axis=1)
    for other, other_sums in ((cut, cut_sums), (few, few_sums)):
        assert set(other) == set(outputs)
        for name, value in outputs.items():
            for row, n in enumerate(lengths):  # smaller batches may cut more padding
                np.testing.assert_allclose(
                    other[name][row, :n], value[row, :n], rtol=1e-5, atol=1e-5
                )
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), other_sums, sums)
