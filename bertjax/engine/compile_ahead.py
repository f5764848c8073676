"""Programs compiled ahead, in background threads, for the shapes a run knows it will meet.

A fine-tuning run knows every batch shape before its first step (its widths:
bertjax.finetune.widths), yet jax compiles a program only when a step first meets its shape,
one after the other on the training thread. `Compiler` lowers and compiles a jitted step at
given shapes in worker threads instead, while the run reads its checkpoint, builds its state
and trains, so that XLA's compiling overlaps the training where cores allow::

    compiler = Compiler(threads=1, mesh=mesh)
    step = compiler.ahead(train_step)           # a jitted function
    step.prepare(abstract_state, abstract_batch, rng)   # shapes (jax.ShapeDtypeStruct)
    ...
    state, metrics = step(state, batch, rng)    # runs the program compiled ahead
    compiler.close()

A call at a shape compiled ahead runs that program (jax's `Compiled` of the same jitted
function at the same shapes), so the results are the jitted function's. A call at a shape
whose compile has not started yet takes it back from the queue and compiles it on the
caller's thread, from the shapes it was asked for, as a worker would have: the program, and
so its key in the persistent compilation cache, does not depend on which thread compiled it
(a traced call can lower to a program that differs from one lowered from shapes in the
naming of its inner functions, so a later run would not find it). One being compiled is
waited for. A compile that failed raises its error where its program is called, or at
`close()` if it never was (CompileAheadError, naming the function and the shapes).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Hashable
from typing import Any

import jax


class CompileAheadError(RuntimeError):
    """A program compiled ahead failed to compile; the cause is chained."""


def signature(args: tuple) -> Hashable:
    """What picks a program: the arguments' tree and each leaf's shape and dtype (arrays and
    jax.ShapeDtypeStruct alike), or its type (Python scalars, traced by type)."""
    leaves, tree = jax.tree.flatten(args)
    return tree, tuple(
        (tuple(x.shape), str(x.dtype)) if hasattr(x, "shape") else type(x).__name__ for x in leaves
    )


def describe(args: tuple) -> str:
    """The arguments' array shapes, for messages: [32, 128] int32, ..."""
    leaves = jax.tree.leaves(args)
    shapes = sorted({f"{list(x.shape)} {x.dtype}" for x in leaves if hasattr(x, "shape")})
    return ", ".join(shapes)


class Compiler:
    """Worker threads that lower and compile jitted functions at given shapes (see the module
    docstring). `mesh`: the mesh the functions trace under (jax.set_mesh is per thread)."""

    def __init__(self, threads: int, mesh: jax.sharding.Mesh | None = None):
        if threads < 1:
            raise ValueError(f"threads={threads} is invalid: must be >= 1")
        self._executor = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="compile-ahead"
        )
        self._mesh = mesh
        self._lock = threading.Lock()
        # (future, what) for every program asked for; `what` names it in errors.
        self._programs: list[tuple[concurrent.futures.Future, str]] = []
        self._surfaced: set[concurrent.futures.Future] = set()
        self._closed = False

    def ahead(self, function: Callable) -> Ahead:
        """`function` (jax.jit's) with programs this compiler compiles ahead."""
        return Ahead(function, self)

    def submit(self, function: Callable, args: tuple, what: str) -> concurrent.futures.Future:
        """Queues lowering and compiling `function` at `args`; its future's result is the
        compiled program."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the compiler is closed")
            future = self._executor.submit(self._compile, function, args)
            self._programs.append((future, what))
        return future

    def compile_now(self, function: Callable, args: tuple):
        """`function`'s program at `args`, compiled on the calling thread as a worker would."""
        return self._compile(function, args)

    def _compile(self, function: Callable, args: tuple):
        if self._mesh is None:
            return function.lower(*args).compile()
        with jax.set_mesh(self._mesh):  # the model's sharding constraints read it
            return function.lower(*args).compile()

    def surfaced(self, future: concurrent.futures.Future) -> None:
        """Marks a failed future's error as raised already (close() does not raise it)."""
        with self._lock:
            self._surfaced.add(future)

    def close(self, failing: bool = False) -> None:
        """Drops the programs not started, waits for those being compiled, and raises the
        first failure no call raised (unless `failing`: the run's own error is the one to
        report)."""
        with self._lock:
            self._closed = True
            programs = list(self._programs)
        for future, _ in programs:
            future.cancel()
        self._executor.shutdown(wait=True)
        if failing:
            return
        for future, what in programs:
            if future.cancelled() or future in self._surfaced:
                continue
            error = future.exception()
            if error is not None:
                raise CompileAheadError(f"compiling {what} ahead failed: {error}") from error


class Ahead:
    """A jitted function with programs compiled ahead at some shapes (Compiler.ahead)."""

    def __init__(self, function: Callable, compiler: Compiler):
        self.function = function
        self._compiler = compiler
        self._programs: dict[Hashable, concurrent.futures.Future] = {}
        self._shapes: dict[Hashable, tuple] = {}  # the arguments each was asked for
        self._name = getattr(function, "__name__", "a step")
        self.served = 0  # calls that ran a program compiled from the shapes asked for

    def prepare(self, *args: Any) -> None:
        """Compiles the program for `args` (shapes: jax.ShapeDtypeStruct with their sharding,
        or arrays and Python scalars) in the background, once per signature."""
        key = signature(args)
        if key not in self._programs:
            what = f"{self._name} for {describe(args)}"
            self._programs[key] = self._compiler.submit(self.function, args, what)
            self._shapes[key] = args

    def prepared(self) -> int:
        """How many programs were asked for."""
        return len(self._programs)

    def __call__(self, *args: Any):
        key = signature(args)
        future = self._programs.get(key)
        if future is None:  # not asked for
            return self.function(*args)
        if future.cancel():  # still queued: compiling here is no slower than waiting
            future = concurrent.futures.Future()
            future.set_result(self._compiler.compile_now(self.function, self._shapes[key]))
            self._programs[key] = future
        try:
            program = future.result()
        except Exception as error:
            self._compiler.surfaced(future)
            raise CompileAheadError(
                f"compiling {self._name} for {describe(args)} ahead failed: {error}"
            ) from error
        self.served += 1
        return program(*args)
