"""The integration tests of test_accelerator_benchmark.py (tests/unit/), with its helpers:
the accelerator benchmark and the step profile, end to end on the tiny models."""

import gzip
import json

import jax
import pytest

from benchmarks import accelerator, profile_step
from benchmarks.harness import report
from tests.helpers.accelerator_benchmark import table_lines


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, layouts, quantities",
    [
        ("tiny", ["padded"], ["mlm_logits", "nsp_logits", "sequence_output", "loss"]),
        ("modernbert_tiny", ["padded", "packed"], ["mlm_logits", "sequence_output", "loss"]),
    ],
)
def test_tiny_run_times_both_backends_and_checks_them(model, layouts, quantities, tmp_path, capsys):
    out_json = tmp_path / "accelerator.json"
    accelerator.main(
        ["--models", model, "--fused", "splash", "--steps", "2", "--warmup", "0"]
        + ["--peak_flops", "1e12", "--json", str(out_json)]
    )
    out = capsys.readouterr().out
    rows = table_lines(out, accelerator.COLUMNS)
    assert [(r[2], r[4]) for r in rows] == [(lay, i) for lay in layouts for i in ("xla", "splash")]
    for i, row in enumerate(rows):
        assert len(row) == len(accelerator.COLUMNS) - 1  # every figure, no note
        figures = dict(zip(accelerator.COLUMNS, row))
        assert float(figures["step ms"]) > 0 and float(figures["tokens/s"]) > 0
        assert figures["MFU"].endswith("%")
        # The initial state is built once per layout and shared by the second backend.
        assert (float(figures["init s"]) > 0) if i % 2 == 0 else figures["init s"] == "-"
    checks = table_lines(out, accelerator.CHECK_COLUMNS)
    per_layout = len(quantities) + 2
    assert [r[2] for r in checks] == [lay for lay in layouts for _ in range(per_layout)]
    for first in range(0, len(checks), per_layout):
        names = [r[3] for r in checks[first : first + per_layout]]
        assert names[:-2] == quantities
        assert names[-2] == "grads, all as one" and names[-1].startswith("grads, worst of")
    assert all(r[-1] == "PASS" for r in checks) and "backend check: PASS" in out

    result = report.read_rows(str(out_json))[-1]["figures"]
    assert result["fused"] == "splash" and result["check_passed"] is True
    assert [c["layout"] for c in result["cells"]] == [lay for lay in layouts for _ in range(2)]
    assert [c["init_s"] is None for c in result["cells"]] == [False, True] * len(layouts)
    for cell in result["cells"]:
        assert cell["step_s"] > 0 and cell["tokens_per_sec"] == pytest.approx(
            cell["sequences_per_sec"] * 128
        )
        assert cell["mfu"] == pytest.approx(cell["flops_per_sec"] / (1e12 * jax.device_count()))
    # bf16 against float32 is a real error, and the fused kernel is about as close to xla.
    for check in result["checks"]:
        assert check["rel_error"] <= check["tolerance"]
        assert check["bf16_error"] > 0


@pytest.mark.slow
def test_cpu_run_without_a_fused_backend_says_so(capsys, tmp_path):
    result = accelerator.main(["--steps", "1", "--warmup", "0", "--profile", str(tmp_path)])
    out = capsys.readouterr().out
    assert "fused attention: none available on cpu" in out
    rows = table_lines(out, accelerator.COLUMNS)
    assert [(r[0], r[2], r[4]) for r in rows] == [
        ("tiny", "padded", "xla"),
        ("modernbert_tiny", "padded", "xla"),
        ("modernbert_tiny", "packed", "xla"),
    ]
    figures = [dict(zip(accelerator.COLUMNS, r)) for r in rows]
    assert all(float(f["init s"]) > 0 and float(f["step ms"]) > 0 for f in figures)
    assert all(f["MFU"] == "n/a" for f in figures)
    assert "note: backend comparison: not run, no fused backend" in out
    assert result["fused"] is None and result["checks"] == []
    # --profile: each cell's optimised train step and a trace of the steps after the timed ones.
    cells = [
        "tiny-128-padded-xla",
        "modernbert_tiny-128-padded-xla",
        "modernbert_tiny-128-packed-xla",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(cells)
    for cell in cells:
        assert (tmp_path / cell / "train_step.hlo.txt").read_text().startswith("HloModule")
        assert list((tmp_path / cell).glob("plugins/profile/*/*.xplane.pb"))
        assert list((tmp_path / cell).glob("plugins/profile/*/perfetto_trace.json.gz"))
        steady = json.loads((tmp_path / cell / "breakdown.json").read_text())
        assert steady["steps_used"] >= 1 and steady["kinds"]["matmul"] > 0
        assert f"profile {cell}:" in out


@pytest.mark.slow
def test_profile_step_on_a_cpu_breaks_the_tiny_step_down(capsys, tmp_path):
    result = profile_step.main(
        ["--out", str(tmp_path), "--models", "tiny", "--warmup", "0", "--steps", "1"]
        + ["--trace_steps", "3", "--graph_arm", "on"]
    )
    out = capsys.readouterr().out
    folder = tmp_path / "tiny-128-padded-xla"
    for name in ("train_step.hlo.txt.gz", "train_step.lowered.hlo.txt.gz"):
        with gzip.open(folder / name, "rt") as f:
            assert f.read().startswith("HloModule jit_train_step")
    assert list(folder.glob("plugins/profile/*/*.trace.json.gz"))
    # The program's findings: 8 x 20 masked positions are the head's rows.
    assert "masked-LM head: 160 rows against 160 masked positions and 1024 tokens" in out
    assert "conditionals and loops: " in out and "1x conditional cond" in out
    # The breakdown: XLA's CPU thunks, every one an instruction of the program.
    assert "steps told apart by run ids" in out and "host gap between steps" in out
    (workload,) = result["workloads"]
    assert workload == json.loads((folder / "breakdown.json").read_text())
    steady = workload["breakdown"]
    assert steady["steps_traced"] == 3 and steady["steps_used"] == 2
    assert steady["unmatched_kernels"] == 0
    for kind in ("matmul", "attention", "elementwise", "optimizer update"):
        assert steady["kinds"][kind] > 0, kind
    assert steady["optimizer_kernels"] == workload["findings"]["optimizer_update"]["kernels"]
    assert 0 < steady["busy_s"] <= steady["step_s"]
    # The arm with conditionals in CUDA graphs runs (the option changes nothing on a CPU).
    assert workload["step_s_conditional_in_graphs"] > 0
    assert "with conditionals in CUDA graphs" in out
