"""The one timer: warm-up calls, every output waited for, rounds, median and spread.

Each side of a comparison is a function of no arguments whose result is waited for
(`jax.block_until_ready` by default: jax dispatches asynchronously, so a call returns before
its work is done). A side is called `warmup` times first (its first call compiles; those
times are kept apart as `Timing.warmup`), then `rounds` rounds run every side once in turn,
so that a change in the machine's load hits every side alike, and ratios are taken within
each round before their median.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

Clock = Callable[[], float]


def ready(out: Any) -> Any:
    """Waits until every jax array in `out` is computed (other leaves pass through: a torch
    side returns a float it has already synchronised)."""
    return jax.block_until_ready(out)


@dataclasses.dataclass(frozen=True)
class Timing:
    """One side's timed rounds, in seconds."""

    name: str
    rounds: tuple[float, ...]
    warmup: tuple[float, ...] = ()  # the untimed calls before the rounds; the first compiles
    cpu: tuple[float, ...] = ()  # this process's CPU seconds in each round, when measured

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def spread(self) -> tuple[float, float]:
        """The fastest and the slowest round."""
        return min(self.rounds), max(self.rounds)

    @property
    def first(self) -> float | None:
        """The first call's seconds, compilation included (None without a warm-up)."""
        return self.warmup[0] if self.warmup else None

    def rate(self, count: float) -> float:
        """`count` things per second at the median round (examples, tokens, steps...)."""
        return count / self.median

    def figures(self) -> dict[str, float | int | None]:
        """The timing as a JSON row's figures."""
        fastest, slowest = self.spread
        out: dict[str, float | int | None] = {
            "median_s": self.median,
            "min_s": fastest,
            "max_s": slowest,
            "rounds": len(self.rounds),
            "first_s": self.first,
        }
        if self.cpu:
            out["cpu_s"] = statistics.median(self.cpu)
        return out


def time_rounds(
    sides: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 3,
    warmup: int | Mapping[str, int] = 1,
    wait: Callable[[Any], Any] = ready,
    clock: Clock = time.perf_counter,
    cpu_clock: Clock | None = None,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Timing]:
    """Times every side: `warmup` untimed calls each (or {side: calls}, for a side warmed up
    otherwise), then `rounds` rounds of one call of every side in turn. `cpu_clock` (e.g.
    time.process_time) also records each round's CPU time; `on_round(index, {side: seconds})`
    is told each finished round (progress lines)."""
    warmups = dict(warmup) if isinstance(warmup, Mapping) else dict.fromkeys(sides, warmup)
    if rounds < 1 or min(warmups.values(), default=0) < 0 or set(warmups) != set(sides):
        raise ValueError(
            f"rounds={rounds} must be >= 1 and warmup={warmup} >= 0 for each of {list(sides)}"
        )

    def timed(function: Callable[[], Any]) -> tuple[float, float]:
        start = clock()
        cpu_start = cpu_clock() if cpu_clock else 0.0
        wait(function())
        cpu = cpu_clock() - cpu_start if cpu_clock else 0.0
        return clock() - start, cpu

    warm: dict[str, list[float]] = {name: [] for name in sides}
    for name, function in sides.items():
        for _ in range(warmups[name]):
            warm[name].append(timed(function)[0])
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(rounds):
        for name, function in sides.items():
            wall, used = timed(function)
            seconds[name].append(wall)
            cpu[name].append(used)
        if on_round:
            on_round(index, {name: values[-1] for name, values in seconds.items()})
    return {
        name: Timing(
            name,
            tuple(seconds[name]),
            tuple(warm[name]),
            tuple(cpu[name]) if cpu_clock else (),
        )
        for name in sides
    }


def time_call(
    function: Callable[[], Any],
    *,
    name: str = "",
    rounds: int = 3,
    warmup: int = 1,
    wait: Callable[[Any], Any] = ready,
    clock: Clock = time.perf_counter,
    cpu_clock: Clock | None = None,
) -> Timing:
    """One side alone (see time_rounds)."""
    sides = {name: function}
    return time_rounds(
        sides, rounds=rounds, warmup=warmup, wait=wait, clock=clock, cpu_clock=cpu_clock
    )[name]


def ratio(slower: Timing, faster: Timing) -> float:
    """How many times faster `faster` ran: the median over rounds of slower / faster
    seconds, each taken within one round (the same load on both)."""
    if len(slower.rounds) != len(faster.rounds):
        raise ValueError(
            f"{slower.name!r} has {len(slower.rounds)} rounds and {faster.name!r} "
            f"{len(faster.rounds)}: a ratio needs the same rounds"
        )
    return statistics.median(s / f for s, f in zip(slower.rounds, faster.rounds))


def stopwatch(clock: Clock = time.perf_counter) -> Callable[[], float]:
    """Seconds since this was called, each time the returned function is called (for what
    runs once: a process from start to exit, a budget)."""
    start = clock()
    return lambda: clock() - start
