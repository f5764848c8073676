"""benchmarks.cpu_step on a small step: a real profile, summed by kind."""

import pathlib

import pytest

from benchmarks import cpu_step


@pytest.mark.slow
def test_a_small_step_s_profile_is_summed_by_kind(tmp_path, capsys):
    result = cpu_step.main(
        ["--model", "modernbert", "--batch", "4", "--width", "64", "--micro_batches", "2"]
        + ["--steps", "1", "--trace_dir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert result["step_s"] > 0
    assert pathlib.Path(result["trace"]).is_file() and str(tmp_path) in result["trace"]
    times = result["ms_per_step"]
    assert list(times) == list(cpu_step.KINDS)
    # bfloat16 products run in a library; every step also has elementwise work.
    assert times["products in a library"] > 0 and times["other fusions and operations"] > 0
    for kind in cpu_step.KINDS:
        assert f"| {kind} | {times[kind]:.1f} |" in out
