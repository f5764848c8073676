"""Programs compiled ahead in background threads (bertjax.engine.compile_ahead): the same results as
the jitted function's, nothing compiled at the call, a queued shape compiled by the caller,
and failures raised where the program is called or when the compiler closes."""

import concurrent.futures
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.engine import compile_ahead, perf


def _jitted(before_tracing=lambda x: None):
    """A small jitted step: (weights [h, h], x [rows, h], index) -> (weights, loss), the
    weights donated as a train step's state is."""

    def step(w, x, index):
        before_tracing(x)
        for _ in range(3):
            x = jnp.tanh(x @ w)
        loss = jnp.sum(x) * (index + 1)
        return w - 0.01 * jnp.sum(x), loss

    return jax.jit(step, donate_argnums=(0,))


def _shape(rows: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((rows, 16), jnp.float32)


def test_calls_run_the_programs_compiled_ahead_with_the_jitted_results():
    compiler = compile_ahead.Compiler(threads=1)
    step = compiler.ahead(_jitted())
    w0 = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32) / 4
    for rows in (8, 24):
        step.prepare(_shape(16), _shape(rows), 0)
    step.prepare(_shape(16), _shape(8), 5)  # the same signature: no second program
    assert step.prepared() == 2
    plain = _jitted()  # the same step, jitted anew
    outputs = {}
    calls = [(jnp.full((rows, 16), 1 / rows), index) for rows, index in ((8, 0), (24, 1), (8, 2))]
    for which, function in (("ahead", step), ("jitted", plain)):
        w = jnp.asarray(w0)
        results = []
        if which == "ahead":
            # Both programs compiled before the compiler closes (close drops a program its one
            # thread has not started yet, which a loaded host can leave queued).
            concurrent.futures.wait(step._programs.values())
            compiler.close()
            step.function = None  # every call runs a program compiled ahead, or fails
        with perf.CompileTime() as compiling:
            for x, index in calls:
                w, loss = function(w, x, index)
                results.append(np.asarray(loss))
        if which == "ahead":
            assert compiling.programs == 0
        outputs[which] = (np.asarray(w), results)
    np.testing.assert_array_equal(outputs["ahead"][0], outputs["jitted"][0])
    for a, b in zip(outputs["ahead"][1], outputs["jitted"][1]):
        np.testing.assert_array_equal(a, b)


class _Recording:
    """A jitted function that records how its programs were made: lowered from shapes, or
    traced by a call with arrays."""

    def __init__(self, jitted):
        self.jitted = jitted
        self.__name__ = "step"
        self.lowered_on: list[str] = []  # the thread of each lowering
        self.called = 0

    def lower(self, *args):
        self.lowered_on.append(threading.current_thread().name)
        return self.jitted.lower(*args)

    def __call__(self, *args):
        self.called += 1
        return self.jitted(*args)


def test_a_shape_still_queued_is_compiled_by_its_caller_from_its_shapes():
    release = threading.Event()

    def wait_on_the_first(x):
        if x.shape[0] == 4:  # the first program holds the only thread
            release.wait(timeout=60)

    compiler = compile_ahead.Compiler(threads=1)
    function = _Recording(_jitted(wait_on_the_first))
    step = compiler.ahead(function)
    step.prepare(_shape(16), _shape(4), 0)
    step.prepare(_shape(16), _shape(8), 0)
    # The second waits behind the first: the call compiles it here instead of waiting, from
    # the shapes it was asked for, as the worker would have (the same program, so the same
    # key in the persistent compilation cache), not by tracing the call.
    w, loss = step(jnp.eye(16), jnp.ones((8, 16)), 0)
    assert np.isfinite(loss)
    assert function.called == 0
    assert function.lowered_on[-1] == threading.current_thread().name
    w, loss = step(w, jnp.ones((8, 16)), 1)  # compiled once
    assert function.lowered_on.count(threading.current_thread().name) == 1
    release.set()
    compiler.close()
    assert function.called == 0 and step.served == 2


def test_a_failed_compile_is_raised_where_its_program_is_called():
    def refuse_six_rows(x):
        if x.shape[0] == 6:
            raise ValueError("six rows cannot be traced")

    compiler = compile_ahead.Compiler(threads=1)
    step = compiler.ahead(_jitted(refuse_six_rows))
    step.prepare(_shape(16), _shape(6), 0)
    with pytest.raises(compile_ahead.CompileAheadError, match=r"\[6, 16\].*six rows") as info:
        step(jnp.eye(16), jnp.ones((6, 16)), 0)
    assert isinstance(info.value.__cause__, ValueError)
    compiler.close()  # raised once already: not again


def test_a_failed_compile_never_called_is_raised_at_close_unless_the_run_fails():
    def refuse(x):
        raise ValueError("cannot be traced")

    for failing in (False, True):
        compiler = compile_ahead.Compiler(threads=1)
        step = compiler.ahead(_jitted(refuse))
        step.prepare(_shape(16), _shape(2), 0)
        while not step._programs[compile_ahead.signature((_shape(16), _shape(2), 0))].done():
            threading.Event().wait(0.01)
        if failing:  # the run's own error is the one reported
            compiler.close(failing=True)
        else:
            with pytest.raises(compile_ahead.CompileAheadError, match=r"step for \[16, 16\]"):
                compiler.close()
