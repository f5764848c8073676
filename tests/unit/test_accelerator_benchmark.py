"""benchmarks.accelerator keeps working on CPU: its tiny setting, tables, check and JSON.

The fast tests cover what needs no compilation (choosing the fused backend, the budget,
the figures and the error measures, which kinds of ModernBERT layer a kernel serves); the
slow ones run the script end to end on the tiny models, BERT's and ModernBERT's (padded and
packed rows) each with splash attention in Pallas interpret mode (so that the fused-vs-xla
check really runs), and once as a user on CPU would, where no fused backend exists.
"""

import json

import numpy as np
import pytest

from benchmarks import accelerator
from benchmarks.harness import report
from bertjax.engine import perf
from bertjax.nn import attention, sharding
from tests.helpers.accelerator_benchmark import table_lines


def test_cpu_defaults_to_the_tiny_model_and_names_the_missing_fused_backend(capsys):
    args = accelerator.parse_args([])
    assert args.tiny and args.models == ("tiny", "modernbert_tiny")
    assert [accelerator.seq_lens_for(args, m) for m in args.models] == [(128,), (128,)]
    assert accelerator.parse_args(["--seq_lens", "256"]).seq_lens == (256,)
    fused, line = accelerator.fused_backend("auto")
    assert fused is None
    assert "none available on cpu" in line and "NVIDIA GPU" in line
    fused, line = accelerator.fused_backend("cudnn")
    assert fused is None and "needs an NVIDIA GPU" in line
    fused, line = accelerator.fused_backend("splash")
    assert fused == "splash" and "interpret mode" in line
    for full_size in ("base", "modernbert_base"):  # the full models are not for CPU
        with pytest.raises(SystemExit):
            accelerator.parse_args(["--models", full_size])
        expected = f"--models: {full_size!r} is not one of ('tiny', 'modernbert_tiny')"
        assert expected in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--seq_lens='128,x' is invalid: give positive integers"):
        accelerator.parse_args(["--seq_lens", "128,x"])
    with pytest.raises(SystemExit):
        accelerator.parse_args(["--seq_lens", "8"])
    assert "--seq_lens=(8,) is invalid: every length must be >= 16" in capsys.readouterr().err


def test_a_fused_request_that_falls_back_says_why():
    settings = accelerator.make_settings("tiny", "splash", 8, 64, "bfloat16", 0)
    mesh = sharding.make_mesh((-1, 1, 1))
    impl, why = accelerator.resolved_attention(settings.model, 8, 64, mesh)
    assert impl == "xla" and "not a multiple of 128" in why
    impl, _ = accelerator.resolved_attention(settings.model, 8, 128, mesh)
    assert impl == "splash"


def test_modernbert_layers_resolve_apart(monkeypatch):
    monkeypatch.setattr(attention, "_logged", set())
    mesh = sharding.make_mesh((-1, 1, 1))
    splash = accelerator.make_settings("modernbert_tiny", "splash", 8, 128, "bfloat16", 0).model
    for packed in (False, True):  # splash serves every layer, with documents too
        by_kind, _ = accelerator.attention_by_layer_kind(splash, 8, 128, mesh, packed)
        assert by_kind == {"global": "splash", "local": "splash"}
    # On an NVIDIA GPU cuDNN serves global layers of padded rows: the cell runs and its note
    # names the local layers left on xla; packed rows (documents) it cannot serve at all.
    monkeypatch.setattr(attention, "_platform", lambda: "nvidia")
    cudnn = accelerator.make_settings("modernbert_tiny", "cudnn", 8, 128, "bfloat16", 0).model
    by_kind, why = accelerator.attention_by_layer_kind(cudnn, 8, 128, mesh)
    assert by_kind == {"global": "cudnn", "local": "xla"} and "two-sided window" in why
    assert accelerator.other_layers_note(by_kind, "cudnn") == "local layers run xla"
    assert accelerator.resolved_attention(cudnn, 8, 128, mesh)[0] == "cudnn"
    impl, why = accelerator.resolved_attention(cudnn, 8, 128, mesh, documents=True)
    assert impl == "xla" and "document" in why
    # BERT's layers are of one kind.
    bert = accelerator.make_settings("tiny", "cudnn", 8, 128, "bfloat16", 0).model
    assert accelerator.attention_by_layer_kind(bert, 8, 128, mesh)[0] == {"all": "cudnn"}


def test_packed_batches_hold_whole_documents():
    rng = np.random.default_rng(0)
    batch = accelerator.make_batch("packed", rng, 4, 128, "modernbert_tiny", 512)
    mask, documents, positions = batch["input_mask"], batch["document_ids"], batch["positions"]
    assert mask[1:].all() and not mask[0].all()  # row 0 ends in padding
    assert np.all((documents > 0) == (mask > 0))
    for row in range(4):
        real = documents[row][mask[row] > 0]
        assert np.all(np.diff(real) >= 0) and real[0] == 1 and real.max() >= 2
        starts = np.flatnonzero(np.diff(real, prepend=0))  # each document starts at 0
        assert np.all(positions[row][starts] == 0)
        assert np.all(np.diff(positions[row][: len(real)])[np.diff(real) == 0] == 1)
    picked = np.take_along_axis(mask, batch["masked_lm_positions"], axis=1)
    assert batch["masked_lm_positions"].shape == (4, 38) and picked.all()  # 30% of 128


def test_padded_batches_are_mostly_full_rows():
    rng = np.random.default_rng(0)
    batch = accelerator.make_batch("padded", rng, 32, 128, "tiny", 512)
    lengths = batch["input_mask"].sum(axis=1)
    assert lengths[0] < 128 and (lengths == 128).sum() >= 24 and lengths.min() >= 32
    assert batch["masked_lm_positions"].shape == (32, 20)  # google's 20 at 128


def test_figures_of_a_cell():
    cell = accelerator.Cell(
        "base", 128, 8, "xla", compile_s=3.0, step_s=0.1, flops_per_sequence=1e9, peak_flops=1e11
    )
    assert cell.sequences_per_sec == pytest.approx(80.0)
    assert cell.tokens_per_sec == pytest.approx(80.0 * 128)
    assert cell.mfu == pytest.approx(0.8)
    row = dict(zip(accelerator.COLUMNS, cell.row()))
    assert row["step ms"] == "100.00" and row["MFU"] == "80.0%" and row["tokens/s"] == "10240"
    unknown = accelerator.Cell("base", 128, 8, "xla", step_s=0.1, flops_per_sequence=1e9)
    assert unknown.mfu is None and dict(zip(accelerator.COLUMNS, unknown.row()))["MFU"] == "n/a"
    skipped = accelerator.Cell("base", 128, 8, "cudnn", note="skipped: over the time budget")
    assert dict(zip(accelerator.COLUMNS, skipped.row()))["step ms"] == "-"
    assert perf.peak_flops_per_device("NVIDIA H200", "bfloat16") == 989e12
    assert perf.peak_flops_per_device("TPU v5 lite", "bfloat16") == 197e12


def test_gradient_errors_skip_leaves_without_gradient():
    rng = np.random.default_rng(0)
    exact = {"w": rng.standard_normal(100), "key_bias": np.full(4, 1e-12)}
    xla = {"w": exact["w"] * 1.001, "key_bias": np.full(4, 1e-6)}
    fused = {"w": exact["w"] * 1.002, "key_bias": np.full(4, -1e-6)}
    (all_name, rel_all, noise_all, max_abs), (leaf_name, rel_leaf, noise_leaf, _) = (
        accelerator._gradient_errors(fused, xla, exact)
    )
    assert "1/2 leaves" in leaf_name
    # The key bias's rounding (2e-6 apart, relative error 2) would dominate the worst leaf.
    assert rel_leaf == pytest.approx(0.001 / 1.001, rel=1e-6)
    assert noise_leaf == pytest.approx(0.001, rel=1e-6)
    assert max_abs == pytest.approx(np.max(np.abs(exact["w"])) * 0.001, rel=1e-6)
    assert 0 < rel_all < 0.01 and 0 < noise_all < 0.01


def test_budget_skips_work_with_a_note(tmp_path, capsys):
    out_json = tmp_path / "out.json"
    result = accelerator.main(
        ["--fused", "splash", "--budget_s", "1e-9", "--peak_flops", "2e12", "--json", str(out_json)]
    )
    out = capsys.readouterr().out
    assert "2 T (--peak_flops)" in out
    rows = table_lines(out, accelerator.COLUMNS)
    assert [(r[0], r[2], r[4]) for r in rows] == [
        (model, layout, impl)
        for model, layout in (
            ("tiny", "padded"),
            ("modernbert_tiny", "padded"),
            ("modernbert_tiny", "packed"),
        )
        for impl in ("xla", "splash")
    ]
    assert all("skipped: over the time budget" in r[-1] for r in rows)
    assert "check tiny: skipped, over the 1e-09 s budget" in out
    assert "check modernbert_tiny (packed): skipped, over the 1e-09 s budget" in out
    (row,) = report.read_rows(str(out_json))
    assert row["benchmark"] == "accelerator" and row["figures"] == json.loads(json.dumps(result))
    assert result["checks"] == [] and result["check_passed"] is None


def test_a_failing_kernel_is_reported_not_raised(monkeypatch, capsys):
    def no_kernel(*args, **kwargs):
        raise RuntimeError("cuDNN is not detected.\nmore detail")

    monkeypatch.setattr(accelerator, "initial_state", lambda setup, seed: (None, 0.0))
    monkeypatch.setattr(accelerator, "time_cell", no_kernel)
    monkeypatch.setattr(accelerator, "check_backends", no_kernel)
    result = accelerator.main(["--fused", "splash"])
    out = capsys.readouterr().out
    rows = table_lines(out, accelerator.COLUMNS)
    assert [r[4] for r in rows] == ["xla", "splash"] * 3
    assert all(r[-1] == "failed: RuntimeError: cuDNN is not detected." for r in rows)
    assert "note: check tiny seq 128: failed: RuntimeError: cuDNN is not detected." in out
    assert "note: check modernbert_tiny (packed) seq 128: failed: RuntimeError" in out
    assert [c["step_s"] for c in result["cells"]] == [None] * 6


def test_the_device_grid_uses_the_recipes_at_google_sizes():
    args = accelerator.parse_args(["--tiny"])
    args.tiny = False  # as on a GPU or TPU
    for name, layers, hidden in (("base", 12, 768), ("large", 24, 1024)):
        for seq_len, batch, predictions in ((128, 256, 20), (512, 64, 80)):
            assert accelerator.default_batch_size(args, seq_len) == batch
            settings = accelerator.make_settings(name, "cudnn", batch, seq_len, "bfloat16", 0)
            model = settings.model
            assert (model.num_layers, model.hidden_size, model.vocab_size) == (
                layers,
                hidden,
                30522,
            )
            assert model.attention_impl == "cudnn" and model.attention_dropout == 0.0
            assert model.dtype == "bfloat16" and model.hidden_dropout == 0.1
            assert settings.data.masking.max_predictions_per_seq == predictions
            assert settings.run.token_capacity == 1.0 and settings.optimizer.name == "adamw"
    assert settings.model.scan_layers and settings.model.remat_policy == "dots"  # large's recipe

    # ModernBERT-base at its phase-1 length, with its recipe's 30% predictions, on both layouts.
    assert accelerator.seq_lens_for(args, "modernbert_base") == (1024,)
    assert accelerator.layouts_for("modernbert_base") == ("padded", "packed")
    assert accelerator.default_batch_size(args, 1024) == 32
    settings = accelerator.make_settings("modernbert_base", "cudnn", 32, 1024, "bfloat16", 0)
    model = settings.model
    assert (model.num_layers, model.hidden_size, model.vocab_size, model.window) == (
        22,
        768,
        50368,
        64,
    )
    assert model.attention_impl == "cudnn" and model.attention_dropout == 0.0
    assert model.scan_layers and model.remat_policy == "dots" and model.dtype == "bfloat16"
    assert settings.data.masking.max_predictions_per_seq == 307
    assert settings.optimizer.name == "stable_adamw" and settings.run.batch_warmup_steps == 0
