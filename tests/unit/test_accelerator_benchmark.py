"""benchmarks.accelerator keeps working on CPU: its tiny setting, tables, check and JSON.

The fast tests cover what needs no compilation (choosing the fused backend, the budget,
the figures and the error measures, which kinds of ModernBERT layer a kernel serves); the
slow ones run the script end to end on the tiny models, BERT's and ModernBERT's (padded and
packed rows) each with splash attention in Pallas interpret mode (so that the fused-vs-xla
check really runs), and once as a user on CPU would, where no fused backend exists. The
step profile's readers (benchmarks.harness.hlo and .profile) are tested on a small GPU-style
program and traces written by hand: the kinds, seconds, gaps, counts and findings they must
report.
"""

import json

import numpy as np
import pytest

from benchmarks import accelerator, profile_step
from benchmarks.harness import hlo, profile, report
from bertjax.engine import perf
from bertjax.nn import attention, sharding
from tests.helpers.accelerator_benchmark import (
    GPU_PROGRAM,
    LOWERED_PROGRAM,
    cpu_trace,
    gpu_trace,
    table_lines,
)


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


# ----------------------------------------------------------------------------- the profile


def test_the_program_parses_into_instructions_and_kernels():
    program = hlo.Program.parse(GPU_PROGRAM)
    assert program.module == "jit_train_step" and program.entry == "main.9"
    gemm = program.instruction("gemm_fusion")
    assert (gemm.opcode, gemm.fusion_kind, gemm.calls) == ("fusion", "kCustom", ("gemm_body",))
    assert gemm.operands == ("x", "w.1") and gemm.shape == "bf16[4,8]{1,0}"
    assert gemm.op_name.endswith("mlp/intermediate/dot_general")
    cudnn = program.instruction("custom-call.1")
    assert cudnn.target == "__cudnn$fmhaSoftmax"
    assert cudnn.arrays() == [("bf16", (2, 4, 2, 8)), ("u8", (0,))]
    assert program.instruction("cond.5").calls == ("apply", "skip")
    # A GPU kernel is named after its fusion, '.' and '-' made '_'.
    assert program.instruction("loop_update_fusion_1").name == "loop_update_fusion.1"
    # The kernels: the entry's and the conditional's branches', not fusion bodies, not
    # parameters, tuples or the conditional itself.
    assert [i.name for i in program.executed()] == [
        "gemm_fusion",
        "custom-call.1",
        "custom-call.2",
        "loop_gelu_fusion",
        "transpose_fusion",
        "input_reduce_fusion",
        "gather_fusion",
        "all-reduce-start",
        "all-reduce-done",
        "loop_update_fusion.1",
    ]
    # A fusion without an op_name of its own takes its root's.
    assert program.op_name(program.instruction("transpose_fusion")).endswith("mlp/transpose")
    with pytest.raises(ValueError, match="no ENTRY computation"):
        hlo.Program.parse("HloModule empty")


def test_instructions_are_classified_by_scope_then_by_what_they_compute():
    program = hlo.Program.parse(GPU_PROGRAM)
    kinds = {i.name: hlo.classify(program, i) for i in program.executed()}
    assert kinds == {
        "gemm_fusion": hlo.MATMUL,
        "custom-call.1": hlo.ATTENTION,  # cuDNN's kernel, in attention's scope
        "custom-call.2": hlo.MATMUL,  # a cuBLAS call, by its target
        "loop_gelu_fusion": hlo.ELEMENTWISE,
        "transpose_fusion": hlo.LAYOUT,
        "input_reduce_fusion": hlo.REDUCTION,
        "gather_fusion": hlo.GATHER,
        "all-reduce-start": hlo.COLLECTIVE,
        "all-reduce-done": hlo.COLLECTIVE,
        "loop_update_fusion.1": hlo.OPTIMIZER,  # elementwise, in the update's scope
    }
    # The scope wins over what is computed: a product inside attention is attention's.
    scoped = hlo.Instruction(
        "fusion.7", "fusion", "f32[2,8]", "jit(f)/dot_product_attention/dot", calls=("gemm_body",)
    )
    assert hlo.computes(program, scoped) == hlo.MATMUL
    assert hlo.classify(program, scoped) == hlo.ATTENTION


def test_a_gpu_trace_breaks_down_into_kinds_gaps_and_counts():
    # Two GPUs ran the step (on their shards); the first one's events are read.
    trace = profile.read_trace(gpu_trace(3, 1000, device=1) + gpu_trace(3, 1000, device=0))
    assert {e.line for e in trace.events} == {"1/7", "1/8"}  # the first GPU's streams only
    result = profile.breakdown(trace, GPU_PROGRAM)
    # Three executions make two complete steps (the last has no next one to end it).
    assert (result.steps_traced, result.steps_used, result.boundaries) == (3, 2, "module spans")
    assert result.step_s == pytest.approx(1e-3)
    expected_us = {
        hlo.MATMUL: 120,
        hlo.ATTENTION: 150,
        hlo.ELEMENTWISE: 50,
        hlo.REDUCTION: 40,
        hlo.GATHER: 0,
        hlo.OPTIMIZER: 80,
        hlo.LAYOUT: 20,
        hlo.COLLECTIVE: 0,
        hlo.INPUT: 100,
        hlo.OTHER: 0,
    }
    assert result.kinds == pytest.approx({k: v * 1e-6 for k, v in expected_us.items()})
    # Busy [0, 360) and [400, 550): 40 us idle inside the step, all of it before the update;
    # from the copy's end to the next step, 450 us of host gap.
    assert result.busy_s == pytest.approx(510e-6)
    assert result.idle_in_step_s == pytest.approx(40e-6)
    assert result.idle_before_update_s == pytest.approx(40e-6)
    assert result.host_gap_s == pytest.approx(450e-6)
    assert result.input_overlapped_s == pytest.approx(50e-6)
    assert result.kernels_per_step == 7 and result.optimizer_kernels == 1
    assert result.kernels[hlo.MATMUL] == 2 and result.kernels[hlo.INPUT] == 0
    assert result.distinct_fusions == 5 and result.program_fusions == 6
    assert result.unmatched_kernels == 0
    shares = result.shares()
    assert shares[profile.HOST_GAP] == pytest.approx(0.45)
    # The shares add up to the step and the 50 us the copy ran beside the update.
    assert sum(shares.values()) == pytest.approx(1.05)
    assert result.top[0]["name"] == "custom-call.1" and result.top[0]["kind"] == hlo.ATTENTION
    table = result.table()
    assert "host gap between steps     0.450   45.0%" in table
    assert "kernels that ran side by side count twice (0.050 ms/step of it)" in table
    assert "the optimizer update 1 kernels (0.080 ms)" in table
    assert "device idle right before the optimizer update: 0.040 ms/step" in table
    assert "input transfer 0.100 ms/step, 0.050 ms of it under compute" in table
    assert json.loads(json.dumps(result.to_json()))["shares"][hlo.MATMUL] == pytest.approx(0.12)


def test_a_cpu_trace_splits_steps_by_run_and_counts_a_conditionals_own_time():
    # Two simulated CPU devices; the first one's thunks are read.
    events = cpu_trace(4, 1000, device=1) + cpu_trace(4, 1000, device=0)
    result = profile.breakdown(profile.read_trace(events), GPU_PROGRAM)
    # Four runs, three complete steps: the first of them (the profiler starting) left out.
    assert (result.steps_traced, result.steps_used, result.boundaries) == (4, 2, "run ids")
    assert result.kinds[hlo.MATMUL] == pytest.approx(300e-6)
    assert result.kinds[hlo.OPTIMIZER] == pytest.approx(100e-6)
    assert result.kinds[hlo.OTHER] == pytest.approx(100e-6)  # the conditional's own time
    assert result.kernels_per_step == 2  # the conditional is not a kernel
    assert result.host_gap_s == pytest.approx(500e-6) and result.idle_in_step_s == 0
    assert result.idle_before_update_s == 0  # the conditional's thunk was running


def test_a_trace_without_the_programs_module_is_an_error():
    trace = profile.read_trace(gpu_trace(steps=2, step_us=1000))
    other = GPU_PROGRAM.replace("HloModule jit_train_step", "HloModule jit_other_step")
    with pytest.raises(ValueError, match="the trace has no event of the module 'jit_other_step'"):
        profile.breakdown(trace, other)


def test_program_findings_count_what_the_issue_asks():
    shapes = hlo.Shapes(tokens=64, hidden=8, vocab=50, predictions=12, parameter_leaves=1)
    findings = hlo.program_findings(GPU_PROGRAM, LOWERED_PROGRAM, shapes)
    assert findings["optimizer_update"]["kernels"] == 1
    assert findings["optimizer_update"]["kernels_per_leaf"] == 1.0
    assert findings["control_flow"] == [
        {"opcode": "conditional", "origin": "cond", "trip_count": None, "count": 1}
    ]
    f32 = findings["float32_activations"]
    # Two activation-sized converts from bfloat16 (the weight's is too small), one origin.
    assert f32["converts_before_optimisation"] == 2
    assert f32["converts_by_origin"] == [["layer_N/attention/layer_norm/convert_element_type", 2]]
    layout = findings["attention_layout"]
    assert layout["transposes_before_optimisation"] == 1
    assert layout["shapes_before_optimisation"] == ["1x bf16[4,16,2,4]"]
    # The head's 12 rows are the masked positions; the encoder's product as wide is not it.
    head = findings["mlm_head"]
    assert head["products"] == [{"shape": "f32[4,3,50]", "rows": 12}]
    assert head["masked_rows_only"] is True
    assert findings["program"]["kernels"] == 10 and findings["program"]["fusions"] == 6
    text = hlo.format_findings(findings)
    assert "conditionals and loops: 1x conditional cond" in text
    assert "12 rows against 12 masked positions and 64 tokens (masked positions only)" in text


def test_profile_step_takes_the_tiny_models_on_a_cpu(capsys):
    args = profile_step.parse_args(["--out", "unused"])
    assert [w[:3] for w in args.workloads] == [
        ("tiny", 128, "padded"),
        ("modernbert_tiny", 128, "packed"),
    ]
    args = profile_step.parse_args(
        ["--out", "unused", "--full", "--lower_only", "--models", "base"]
    )
    assert args.workloads == (("base", 128, "padded"),)
    with pytest.raises(SystemExit):
        profile_step.parse_args(["--out", "unused", "--full"])
    assert "--full on a CPU needs --lower_only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        profile_step.parse_args(["--out", "unused", "--models", "base"])
    assert "--models: 'base' is not one of ('tiny', 'modernbert_tiny')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        profile_step.parse_args(["--out", "unused", "--trace_steps", "1"])
    assert "--trace_steps=1 is invalid: must be >= 2" in capsys.readouterr().err


def test_a_failing_workload_is_reported_and_the_next_one_runs(monkeypatch, tmp_path, capsys):
    ran = []

    def workload(model_name, seq_len, layout, args, peak):
        ran.append(model_name)
        if model_name == "tiny":
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nmore detail")
        return {"workload": model_name}

    monkeypatch.setattr(profile_step, "profile_workload", workload)
    result = profile_step.main(["--out", str(tmp_path)])
    assert ran == ["tiny", "modernbert_tiny"]
    assert result["workloads"] == [{"workload": "modernbert_tiny"}]
    assert result["notes"] == [
        "tiny at 128: failed: RuntimeError: RESOURCE_EXHAUSTED: out of memory"
    ]
    assert "note: tiny at 128: failed: RuntimeError" in capsys.readouterr().out
