"""tests/helpers/compile_profile.py: the plugin that says where the suite's compiling goes."""

import time

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers.compile_profile import CompileProfile, Record, functions_defined_here, summary


def test_each_compile_event_is_recorded_with_its_test_and_call_site():
    scale = float(time.time_ns() % 1_000_003)  # a new program on every run: no cache hit

    def scaled(x):
        return jnp.tanh(x * scale).sum()

    with CompileProfile() as profile:
        profile.start("tests/unit/x.py::a_test")
        scaled_jit = jax.jit(scaled)
        scaled_jit(np.ones((5, 3), np.float32))
        # Op by op, at a shape no other test uses: programs of jax's own functions.
        jnp.cos(jnp.ones((int(scale) % 89 + 211, 3)))
    after = len(profile.records)
    jax.jit(lambda x: x - scale)(np.ones(2))  # not listening any more
    assert len(profile.records) == after

    ours = [r for r in profile.records if r.function == "scaled"]
    assert {r.kind for r in ours} == {"tracing", "lowering", "compiling"}
    assert all(r.test == "tests/unit/x.py::a_test" and r.seconds > 0 for r in ours)
    this_test = test_each_compile_event_is_recorded_with_its_test_and_call_site.__name__
    assert all(
        r.site.startswith("tests/unit/test_compile_profile.py:") and r.site.endswith(this_test)
        for r in ours
    )
    assert any(r.function == "cos" and r.kind == "compiling" for r in profile.records)


def test_the_summary_splits_op_by_op_programs_from_ours():
    ours = functions_defined_here()
    assert {"call_site", "summary", "train_step", "<lambda>"} <= ours
    assert "multiply" not in ours and "convert_element_type" not in ours
    records = [
        Record("t::a", "tracing", "train_step", 1.0, "bertjax/engine/steps.py:1:f"),
        Record("t::a", "compiling", "jit(train_step)", 3.0, "bertjax/engine/steps.py:1:f"),
        Record("t::b", "compiling", "jit(multiply)", 0.5, "tests/unit/t.py:9:test_b"),
        Record("t::b", "lowering", "jit(multiply)", 0.5, "tests/unit/t.py:9:test_b"),
    ]
    lines = summary(records, ours)
    assert lines[0] == (
        "5.0 s in jax's compile events: tracing 1.0 s, lowering 0.5 s, compiling 3.5 s"
    )
    assert lines[1].startswith("2 programs compiled; 1 of them op by op (jax's own functions), ")
    assert "1.0 s (20 %)" in lines[1]
    assert lines[3].split() == ["4.0", "s", "1", "jit(train_step)", "at"] + [
        "bertjax/engine/steps.py:1:f"
    ]
    assert lines[-2:] == ["      4.0 s  t::a", "      1.0 s  t::b"]
    assert summary([], ours) == ["no compile events recorded"]
