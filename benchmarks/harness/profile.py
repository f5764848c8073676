"""Where a step's time goes: a jax.profiler trace read against the step's optimised HLO.

`jax.profiler.trace(dir)` writes a Chrome trace (`plugins/profile/<run>/*.trace.json.gz`,
which ui.perfetto.dev opens) whose device events name the HLO instruction they run:

- on a GPU, kernels and copies on the device's "Stream" lines, with args hlo_op and
  hlo_module (a fusion's kernel is named after the fusion; a cuBLAS or cuDNN kernel has its
  library's name and the custom call in hlo_op), and the module's executions on its "XLA
  Modules" line; host-to-device copies are "MemcpyH2D" events;
- on a TPU, the same on its "XLA Ops" and "XLA Modules" lines;
- on a CPU, the thunks of XLA's CPU runtime, with args hlo_op, hlo_module and run_id (one
  per execution).

`breakdown` matches each event to its instruction (benchmarks.harness.hlo, which sorts it
into a kind), splits the executions of the step into steps and reports the steady ones:
seconds per kind, the device idle inside a step and between steps (host gaps),
host-to-device copies and how much of them overlapped compute, kernel counts and the
instructions that took longest. `record` takes such a trace of a function's run.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from benchmarks.harness.hlo import (
    ATTENTION,
    BRANCHING_OPS,
    COLLECTIVE,
    ELEMENTWISE,
    INPUT,
    KINDS,
    LAYOUT,
    MATMUL,
    OPTIMIZER,
    OTHER,
    REDUCTION,
    Instruction,
    Program,
    classify,
    short_op_name,
)

IDLE_IN_STEP = "device idle in the step"
HOST_GAP = "host gap between steps"
# Kernel names of events no instruction claims (GPU libraries' own kernels).
KERNEL_NAME_KINDS = (
    (re.compile(r"fmha|flash|sdpa", re.IGNORECASE), ATTENTION),
    (re.compile(r"gemm|xmma|cutlass|nvjet|cublas|matmul|wgmma", re.IGNORECASE), MATMUL),
    (re.compile(r"nccl|all_?reduce|all_?gather", re.IGNORECASE), COLLECTIVE),
    (re.compile(r"transpose|copy", re.IGNORECASE), LAYOUT),
    (re.compile(r"reduce", re.IGNORECASE), REDUCTION),
    (re.compile(r"fusion|loop_", re.IGNORECASE), ELEMENTWISE),
)
HOST_TO_DEVICE = re.compile(r"h2d|htod|host.?to.?device|transfer.?to.?device", re.IGNORECASE)
MEMCPY = re.compile(r"memcpy|memset|transfer", re.IGNORECASE)


# ----------------------------------------------------------------------------- the trace


@dataclasses.dataclass(frozen=True)
class DeviceEvent:
    """One kernel, copy or thunk on the device's timeline (microseconds)."""

    name: str
    start: float
    duration: float
    hlo_op: str = ""
    module: str = ""
    run: str = ""  # the execution it belongs to, where the trace says (CPU thunks)
    line: str = ""
    device: str = ""  # "/device:GPU:0" (its process), or "cpu:<ordinal>" for a CPU thunk
    # Its duration less that of the events nested in it on its line (a CPU loop's or
    # conditional's thunk holds its body's); the duration where nothing is nested.
    own: float | None = None

    @property
    def own_time(self) -> float:
        return self.duration if self.own is None else self.own

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclasses.dataclass(frozen=True)
class Trace:
    """One device's events and the executions of modules (their spans on the device); a
    trace of several devices keeps the first device's."""

    events: tuple[DeviceEvent, ...]
    executions: tuple[tuple[str, float, float], ...]  # (module line's name, start, end)


def read_trace(events: Sequence[Mapping[str, Any]]) -> Trace:
    """The device events of a Chrome trace's traceEvents (see the module docstring)."""
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e.get("pid")] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
    lines = {key: name for key, name in threads.items() if key[0] in devices}
    streams = {key for key, name in lines.items() if name.startswith("Stream")}
    ops_lines = {key for key, name in lines.items() if name == "XLA Ops"}
    module_lines = {key for key, name in lines.items() if name == "XLA Modules"}

    def is_device_event(e: Mapping[str, Any], key: tuple[Any, Any]) -> bool:
        if streams:  # a GPU: its streams hold the kernels and copies
            return key in streams
        if ops_lines:  # a TPU
            return key in ops_lines
        name = e.get("name", "")  # a CPU: the runtime's thunks
        return "hlo_op" in e.get("args", {}) and not name.startswith("end: ")

    device_events = []
    executions = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        key = (e.get("pid"), e.get("tid"))
        args = e.get("args", {})
        device = processes.get(e.get("pid"), "")
        if not device.startswith("/device:"):
            device = f"cpu:{args.get('device_ordinal', 0)}"
        if key in module_lines:
            executions.append(
                (device, e.get("name", ""), float(e["ts"]), float(e["ts"]) + e["dur"])
            )
        elif is_device_event(e, key):
            device_events.append(
                DeviceEvent(
                    name=e.get("name", ""),
                    start=float(e["ts"]),
                    duration=float(e["dur"]),
                    hlo_op=str(args.get("hlo_op", "")),
                    module=str(args.get("hlo_module", "")),
                    run=str(args.get("run_id", "")),
                    line=f"{e.get('pid')}/{e.get('tid')}",
                    device=device,
                )
            )
    # One device's events, the first's: every device runs the same program on its shard.
    first = min((e.device for e in device_events), key=_device_order, default="")
    device_events = [e for e in device_events if e.device == first]
    executions = sorted((x[1:] for x in executions if x[0] == first), key=lambda x: x[1])
    return Trace(tuple(_own_times(device_events)), tuple(executions))


def _device_order(device: str) -> tuple[str, int]:
    """ "/device:GPU:10" after "/device:GPU:2": the name, then the ordinal as a number."""
    name, _, ordinal = device.rpartition(":")
    return (name, int(ordinal)) if ordinal.isdigit() else (device, 0)


def _own_times(events: list[DeviceEvent]) -> list[DeviceEvent]:
    """The events by start, each with its own time: its duration less that of the events
    it wholly contains on its line (one that only overlaps it, as consecutive kernels'
    timestamps may by a little, is not nested)."""
    events = sorted(events, key=lambda e: (e.line, e.start, -e.duration))
    own = [e.duration for e in events]
    open_events: list[int] = []  # indices of the events enclosing the current one

    def encloses(outer: DeviceEvent, inner: DeviceEvent) -> bool:
        return outer.line == inner.line and outer.start <= inner.start and inner.end <= outer.end

    for i, event in enumerate(events):
        while open_events and not encloses(events[open_events[-1]], event):
            open_events.pop()
        if open_events:
            own[open_events[-1]] -= event.duration
        open_events.append(i)
    out = [dataclasses.replace(e, own=max(0.0, t)) for e, t in zip(events, own)]
    return sorted(out, key=lambda e: e.start)


def record(directory: str | pathlib.Path, run: Callable[[], Any]) -> Trace:
    """Traces `run()` (which waits for its work) into `directory` and reads the device's
    events back. Python's tracer is off: it would slow the host whose gaps are measured."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    with jax.profiler.trace(str(directory), create_perfetto_trace=True, profiler_options=options):
        run()
    return read_trace(load_trace_events(trace_file(directory)))


def trace_file(directory: str | pathlib.Path) -> pathlib.Path:
    """The newest trace jax.profiler.trace wrote under `directory`."""
    found = sorted(
        pathlib.Path(directory).glob("plugins/profile/*/*.trace.json.gz"),
        key=lambda p: p.stat().st_mtime,
    )
    if not found:
        raise FileNotFoundError(f"no plugins/profile/*/*.trace.json.gz under {directory}")
    return found[-1]


def load_trace_events(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """A Chrome trace file's traceEvents (gzipped or not)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


# ----------------------------------------------------------------------------- breakdown


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(interval: tuple[float, float], merged: Sequence[tuple[float, float]]) -> float:
    a, b = interval
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged)


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """A steady step's time by kind (seconds per step), from a trace and the step's HLO."""

    module: str
    steps_traced: int
    steps_used: int
    boundaries: str  # how steps were told apart: "run ids", "module spans" or "none"
    step_s: float
    kinds: dict[str, float]  # seconds of kernel time per kind
    kernels: dict[str, float]  # kernels per kind
    idle_in_step_s: float
    # Of it, the gap right before the optimizer update's first kernel (where a conditional
    # around the update waits for the host).
    idle_before_update_s: float
    host_gap_s: float
    busy_s: float  # the union of the device's events
    input_overlapped_s: float  # of the input transfer, the part under compute
    kernels_per_step: float
    distinct_fusions: int  # fusions run in a step (the trace's)
    program_fusions: int  # fusions the program can run (the HLO's)
    optimizer_kernels: float
    unmatched_kernels: float  # kernels no instruction of the HLO claims (classed by name)
    top: tuple[dict[str, Any], ...]  # the instructions that took longest

    def shares(self) -> dict[str, float]:
        """Each kind's, the idle's and the gaps' share of the step."""
        out = {k: v / self.step_s if self.step_s else 0.0 for k, v in self.kinds.items()}
        out[IDLE_IN_STEP] = self.idle_in_step_s / self.step_s if self.step_s else 0.0
        out[HOST_GAP] = self.host_gap_s / self.step_s if self.step_s else 0.0
        return out

    def table(self) -> str:
        """The breakdown as printed: one row per kind, then the idle time, then counts."""
        shares = self.shares()
        rows = [("kind", "ms/step", "share", "kernels/step")]
        for kind in KINDS:
            rows.append(
                (
                    kind,
                    f"{self.kinds[kind] * 1e3:.3f}",
                    f"{shares[kind]:.1%}",
                    f"{self.kernels[kind]:.0f}",
                )
            )
        rows.append(
            (IDLE_IN_STEP, f"{self.idle_in_step_s * 1e3:.3f}", f"{shares[IDLE_IN_STEP]:.1%}", "")
        )
        rows.append((HOST_GAP, f"{self.host_gap_s * 1e3:.3f}", f"{shares[HOST_GAP]:.1%}", ""))
        rows.append(("step", f"{self.step_s * 1e3:.3f}", "100.0%", f"{self.kernels_per_step:.0f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [
            "  ".join(
                (v.ljust(w) if i == 0 else v.rjust(w)) for i, (v, w) in enumerate(zip(r, widths))
            ).rstrip()
            for r in rows
        ]
        overlap = sum(self.kinds.values()) - self.busy_s
        notes = [
            f"{self.steps_used} steady step(s) of {self.steps_traced} traced (steps told "
            f"apart by {self.boundaries}); kernel time is summed per kind, so kernels that "
            "ran side by side count twice"
            + (f" ({overlap * 1e3:.3f} ms/step of it)" if overlap > 1e-3 * self.step_s else ""),
            f"kernels per step {self.kernels_per_step:.0f}; distinct fusions run "
            f"{self.distinct_fusions} (of {self.program_fusions} in the program); the optimizer "
            f"update {self.optimizer_kernels:.0f} kernels ({self.kinds[OPTIMIZER] * 1e3:.3f} ms)",
        ]
        if self.idle_before_update_s:
            notes.append(
                f"device idle right before the optimizer update: "
                f"{self.idle_before_update_s * 1e3:.3f} ms/step"
            )
        if self.kinds[INPUT]:
            notes.append(
                f"input transfer {self.kinds[INPUT] * 1e3:.3f} ms/step, "
                f"{self.input_overlapped_s * 1e3:.3f} ms of it under compute"
            )
        if self.unmatched_kernels:
            notes.append(
                f"{self.unmatched_kernels:.0f} kernels/step matched no HLO instruction "
                "(classed by their names)"
            )
        if self.top:
            notes.append("longest instructions (ms/step, kind, count/step, op_name):")
            notes += [
                f"  {t['ms']:9.3f}  {t['kind']:<24} {t['count']:4.0f}x  {t['name']}  {t['op_name']}"
                for t in self.top
            ]
        return "\n".join(lines + notes)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shares"] = self.shares()
        out["top"] = list(self.top)
        return out


def _kind_of_event(program: Program, event: DeviceEvent) -> tuple[str, Instruction | None]:
    if not event.hlo_op and MEMCPY.search(event.name):
        return (INPUT if HOST_TO_DEVICE.search(event.name) else OTHER), None
    inst = (program.instruction(event.hlo_op) if event.hlo_op else None) or program.instruction(
        event.name
    )
    if inst is not None:
        return classify(program, inst), inst
    for pattern, kind in KERNEL_NAME_KINDS:
        if pattern.search(event.name):
            return kind, None
    return OTHER, None


def _of_module(name: str, module: str) -> bool:
    """Whether an event's module name ("jit_train_step", or with its program id,
    "jit_train_step(42)") is `module`."""
    return re.fullmatch(rf"{re.escape(module)}(\(\w*\))?", name) is not None


def _step_starts(
    events: Sequence[DeviceEvent], trace: Trace, module: str
) -> tuple[list[float], str]:
    runs: dict[str, float] = {}
    for e in events:
        if e.run and _of_module(e.module, module):
            runs[e.run] = min(runs.get(e.run, math.inf), e.start)
    if len(runs) > 1:
        return sorted(runs.values()), "run ids"
    spans = [start for name, start, _ in trace.executions if _of_module(name, module)]
    if spans:
        return spans, "module spans"
    first = min((e.start for e in events if _of_module(e.module, module)), default=None)
    return ([] if first is None else [first]), "none"


def breakdown(trace: Trace, hlo_text: str, top: int = 12) -> Breakdown:
    """A steady step of the program `hlo_text` (its optimised HLO) in `trace`.

    Steps begin where the trace's executions of the module begin (run ids on a CPU, the
    "XLA Modules" line on a GPU or TPU); each step runs until the next one begins, so the
    device's idle time after a step's last kernel is that step's host gap. The last traced
    step (no next one to end it) and, when at least two others remain, the first (the
    profiler starting) are left out; the rest are averaged."""
    program = Program.parse(hlo_text)
    module = program.module
    # The step's own kernels and the copies no module claims (host-to-device inputs).
    events = [
        e for e in trace.events if _of_module(e.module, module) or (not e.module and not e.hlo_op)
    ]
    starts, boundaries = _step_starts(events, trace, module)
    if not starts:
        raise ValueError(f"the trace has no event of the module {module!r}")
    if len(starts) == 1:
        windows = [(starts[0], max(e.end for e in events))]
    else:
        windows = list(zip(starts, starts[1:]))
        if len(windows) >= 3:
            windows = windows[1:]
    kinds_total = dict.fromkeys(KINDS, 0.0)
    kernels_total = dict.fromkeys(KINDS, 0.0)
    per_instruction: dict[str, list] = {}
    idle = gap = busy_total = input_overlap = unmatched = before_update = 0.0
    kernel_count = 0
    fusions_run: set[str] = set()
    for window_start, window_end in windows:
        inside = [e for e in events if window_start <= e.start < window_end]
        merged = _union((e.start, min(e.end, window_end)) for e in inside)
        busy = _length(merged)
        compute = _union(
            (e.start, e.end) for e in inside if not (not e.hlo_op and MEMCPY.search(e.name))
        )
        last_end = max((e.end for e in inside), default=window_start)
        gap += max(0.0, window_end - last_end) if len(starts) > 1 else 0.0
        idle += max(0.0, min(last_end, window_end) - window_start - busy)
        busy_total += busy
        classified = [(e, *_kind_of_event(program, e)) for e in inside]
        first_update = next((e for e, kind, _ in classified if kind == OPTIMIZER), None)
        if first_update is not None:
            # Where the device's compute (copies aside) last stopped before the update began.
            ready = max((b for a, b in compute if a < first_update.start), default=None)
            if ready is not None:
                before_update += max(0.0, first_update.start - ready)
        for e, kind, inst in classified:
            kinds_total[kind] += e.own_time
            if kind == INPUT:
                input_overlap += _overlap((e.start, e.end), compute)
                continue
            if inst is not None and inst.opcode in BRANCHING_OPS:
                continue  # a loop's or conditional's own thunk: its body's are the kernels
            kernels_total[kind] += 1
            kernel_count += 1
            if inst is None:
                unmatched += 1 if e.hlo_op or e.module else 0
                key, op_name = e.name, ""
            else:
                key, op_name = inst.name, program.op_name(inst)
                if inst.opcode == "fusion":
                    fusions_run.add(inst.name)
            entry = per_instruction.setdefault(key, [0.0, 0, kind, op_name])
            entry[0] += e.own_time
            entry[1] += 1
    n = len(windows)
    step_us = sum(end - start for start, end in windows) / n
    if len(starts) == 1:
        step_us = windows[0][1] - windows[0][0]
    longest = sorted(per_instruction.items(), key=lambda kv: -kv[1][0])[:top]
    us = 1e-6
    return Breakdown(
        module=module,
        steps_traced=len(starts),
        steps_used=n,
        boundaries=boundaries,
        step_s=step_us * us,
        kinds={k: v / n * us for k, v in kinds_total.items()},
        kernels={k: v / n for k, v in kernels_total.items()},
        idle_in_step_s=idle / n * us,
        idle_before_update_s=before_update / n * us,
        host_gap_s=gap / n * us,
        busy_s=busy_total / n * us,
        input_overlapped_s=input_overlap / n * us,
        kernels_per_step=kernel_count / n,
        distinct_fusions=len(fusions_run),
        program_fusions=sum(1 for i in program.executed() if i.opcode == "fusion"),
        optimizer_kernels=kernels_total[OPTIMIZER] / n,
        unmatched_kernels=unmatched / n,
        top=tuple(
            {
                "name": name,
                "kind": kind,
                "ms": total / n * 1e-3,
                "count": count / n,
                "op_name": short_op_name(op_name),
            }
            for name, (total, count, kind, op_name) in longest
        ),
    )
