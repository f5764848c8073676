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

The optimised HLO text (`compiled.as_text()`) gives each instruction its opcode, shape, the
computations it calls and `metadata={op_name=...}`, jax's name stack, which carries
bertjax's name scopes: bertjax.nn.attention.SCOPE around attention, whichever backend
computes it, and bertjax.engine.steps.OPTIMIZER_SCOPE around the optimizer update.

`classify` sorts an instruction into one of KINDS; `breakdown` splits the trace's executions
of the step into steps and reports the steady ones: seconds per kind, the device idle inside
a step and between steps (host gaps), host-to-device copies and how much of them overlapped
compute, kernel counts and the instructions that took longest. `program_findings` reads what
an optimised program holds without running it (the optimizer update's kernels, conditionals
and loops, float32 activation buffers, transposes in attention, the masked-LM head's rows).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import math
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from bertjax.engine.steps import OPTIMIZER_SCOPE
from bertjax.nn.attention import SCOPE as ATTENTION_SCOPE

MATMUL = "matmul"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
GATHER = "gather/scatter"
OPTIMIZER = "optimizer update"
LAYOUT = "layout (transpose/copy)"
COLLECTIVE = "collective"
INPUT = "input transfer"
OTHER = "other"
KINDS = (
    MATMUL,
    ATTENTION,
    ELEMENTWISE,
    REDUCTION,
    GATHER,
    OPTIMIZER,
    LAYOUT,
    COLLECTIVE,
    INPUT,
    OTHER,
)
IDLE_IN_STEP = "device idle in the step"
HOST_GAP = "host gap between steps"

COLLECTIVE_OPS = frozenset(
    (
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "collective-broadcast",
        "ragged-all-to-all",
        "send",
        "recv",
    )
)
MATMUL_OPS = frozenset(("dot", "convolution", "ragged-dot", "scaled-dot"))
GATHER_OPS = frozenset(("gather", "scatter"))
REDUCE_OPS = frozenset(("reduce", "reduce-window", "select-and-scatter", "sort"))
# Data movement without arithmetic.
LAYOUT_OPS = frozenset(
    (
        "transpose",
        "copy",
        "copy-start",
        "copy-done",
        "bitcast-convert",
        "reshape",
        "slice",
        "concatenate",
        "pad",
        "dynamic-slice",
        "dynamic-update-slice",
        "reverse",
        "broadcast",
    )
)
# No device work of their own.
TRIVIAL_OPS = frozenset(
    (
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
        "domain",
        "async-done",
        "async-update",
    )
)
# Run the computations they call; the called instructions are the kernels.
CONTROL_OPS = frozenset(("conditional", "while", "call", "async-start"))
# Of those, the ones whose called computations are control flow, not one operation's body.
BRANCHING_OPS = frozenset(("conditional", "while", "call"))
# Custom calls by target: cuDNN's fused attention, the matrix-product libraries.
ATTENTION_TARGET = re.compile(r"fmha|flash|sdpa|attention", re.IGNORECASE)
# Random bits (dropout's masks) by a custom call on some platforms: elementwise work.
RANDOM_TARGET = re.compile(r"threefry|philox|rng", re.IGNORECASE)
MATMUL_TARGET = re.compile(r"gemm|cublas|matmul|onednn", re.IGNORECASE)
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

# ----------------------------------------------------------------------------- HLO text


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction as the text prints it."""

    name: str
    opcode: str
    shape: str  # as printed: "bf16[256,128,768]{2,1,0}" or a tuple "(f32[...], ...)"
    op_name: str  # metadata op_name (jax's name stack), "" without one
    operands: tuple[str, ...] = ()  # the instructions it reads, by name
    calls: tuple[str, ...] = ()  # computations it calls: fusion bodies, branches, loops
    fusion_kind: str = ""  # kLoop, kInput, kOutput, kCustom for a fusion
    target: str = ""  # a custom call's target
    trip_count: int | None = None  # a while loop's, when XLA knows it

    def arrays(self) -> list[tuple[str, tuple[int, ...]]]:
        """(dtype, dims) of each array in the output shape."""
        return [
            (dtype, tuple(int(d) for d in dims.split(",") if d))
            for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", self.shape)
        ]


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"^([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLED = re.compile(
    r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALLED_LISTS = re.compile(r"\b(?:branch_computations|called_computations|calls)=\{([^}]*)\}")
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def _split_shape(rest: str) -> tuple[str, str]:
    """(shape, what follows it) of an instruction's right-hand side."""
    if not rest.startswith("("):
        shape, _, after = rest.partition(" ")
        return shape, after
    depth = 0
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return rest[: i + 1], rest[i + 1 :].lstrip()
    return rest, ""


def _operand_names(arguments: str) -> tuple[str, ...]:
    """The names in "(bf16[4,8]{1,0} %x, %y)" or "(x, y)": each operand's last word."""
    names, depth, piece = [], 0, ""
    for char in arguments.strip()[1:-1] + ",":
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            words = piece.split()
            if words:
                names.append(words[-1].lstrip("%"))
            piece = ""
        else:
            piece += char
    return tuple(names)


def _parse_instruction(line: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    name, rest = match.groups()
    shape, after = _split_shape(rest)
    opcode = _OPCODE.match(after)
    if not opcode:
        return None
    op_name = _OP_NAME.search(after)
    arguments, _ = _split_shape(after[len(opcode.group(1)) :])
    calls = _CALLED.findall(after)
    for listed in _CALLED_LISTS.findall(after):
        calls += [c.strip().lstrip("%") for c in listed.split(",") if c.strip()]
    kind = _FUSION_KIND.search(after) if opcode.group(1) == "fusion" else None
    target = _TARGET.search(after)
    trips = _TRIP_COUNT.search(after)
    return Instruction(
        name=name,
        opcode=opcode.group(1),
        shape=shape,
        op_name=op_name.group(1) if op_name else "",
        operands=_operand_names(arguments),
        calls=tuple(dict.fromkeys(calls)),
        fusion_kind=kind.group(1) if kind else "",
        target=target.group(1) if target else "",
        trip_count=int(trips.group(1)) if trips else None,
    )


def sanitized(name: str) -> str:
    """An instruction's name as XLA names its GPU kernel (LLVM function names: '.' and '-'
    become '_')."""
    return re.sub(r"[^\w]", "_", name)


@dataclasses.dataclass
class Program:
    """An HLO module's computations and instructions, parsed from its text."""

    module: str
    entry: str
    computations: dict[str, list[Instruction]]

    def __post_init__(self):
        self._by_name: dict[str, Instruction] = {}
        for instructions in self.computations.values():
            for inst in instructions:
                self._by_name.setdefault(inst.name, inst)
                self._by_name.setdefault(sanitized(inst.name), inst)

    @classmethod
    def parse(cls, text: str) -> Program:
        module_line = re.search(r"^HloModule\s+([\w.\-]+)", text, re.MULTILINE)
        computations: dict[str, list[Instruction]] = {}
        entry = ""
        current: list[Instruction] | None = None
        for line in text.splitlines():
            if not line.strip() or line.startswith("HloModule"):
                continue
            header = _COMPUTATION.match(line)
            if header and not line.startswith(" "):
                current = computations.setdefault(header.group(2), [])
                if header.group(1):
                    entry = header.group(2)
                continue
            if line.startswith("}"):
                current = None
                continue
            if current is not None:
                inst = _parse_instruction(line)
                if inst is not None:
                    current.append(inst)
        if not entry:
            raise ValueError("the HLO text has no ENTRY computation")
        return cls(module_line.group(1) if module_line else "", entry, computations)

    def instruction(self, name: str) -> Instruction | None:
        """The instruction of this name, or of this kernel name (sanitized)."""
        return self._by_name.get(name) or self._by_name.get(sanitized(name))

    def body(self, inst: Instruction) -> list[Instruction]:
        """The instructions of the computations `inst` calls, recursively."""
        out = []
        for called in inst.calls:
            for inner in self.computations.get(called, ()):
                out.append(inner)
                out += self.body(inner)
        return out

    def executed(self) -> list[Instruction]:
        """The instructions that run as kernels (or thunks): the entry computation's and
        those of the computations its conditionals and loops run (every branch), not the
        bodies of fusions or reductions; control flow itself and instructions with no
        device work are left out."""
        out: list[Instruction] = []

        def visit(computation: str) -> None:
            for inst in self.computations.get(computation, ()):
                if inst.opcode in CONTROL_OPS:
                    for called in inst.calls:
                        visit(called)
                elif inst.opcode not in TRIVIAL_OPS:
                    out.append(inst)

        visit(self.entry)
        return out

    def op_name(self, inst: Instruction) -> str:
        """Its op_name, or (a fusion's, which some passes leave without one) that of the
        last named instruction of its body: the root's, where the root has one."""
        if inst.op_name or inst.opcode in BRANCHING_OPS:
            return inst.op_name
        for inner in reversed(self.body(inst)):
            if inner.op_name:
                return inner.op_name
        return ""

    def size(self) -> int:
        """Instructions in every computation."""
        return sum(len(instructions) for instructions in self.computations.values())


def _opcodes(program: Program, inst: Instruction) -> set[str]:
    """The opcodes an instruction computes: its own and its body's (a fusion's, an async
    operation's, a reduction's reducer), not those of the branches or loops it runs."""
    if inst.calls and inst.opcode not in BRANCHING_OPS:
        return {i.opcode for i in program.body(inst)} | {inst.opcode}
    return {inst.opcode}


def _base_opcode(opcode: str) -> str:
    return opcode.removesuffix("-start").removesuffix("-done")


def computes(program: Program, inst: Instruction) -> str:
    """The kind of work an executed instruction (or its fused body) does, whatever its name
    scope: collective, matmul, gather/scatter, reduction, layout, elementwise or other."""
    opcodes = _opcodes(program, inst)
    if any(_base_opcode(op) in COLLECTIVE_OPS for op in opcodes):
        return COLLECTIVE
    if opcodes & MATMUL_OPS or (inst.target and MATMUL_TARGET.search(inst.target)):
        return MATMUL
    if opcodes & GATHER_OPS:
        return GATHER
    if opcodes & REDUCE_OPS:
        return REDUCTION
    moving = opcodes - TRIVIAL_OPS - {"fusion"}
    if moving and moving <= LAYOUT_OPS:
        return LAYOUT
    if inst.target and RANDOM_TARGET.search(inst.target):
        return ELEMENTWISE
    if inst.opcode in CONTROL_OPS or inst.opcode in ("custom-call", "infeed", "outfeed"):
        return OTHER
    return ELEMENTWISE


def classify(program: Program, inst: Instruction) -> str:
    """The kind (one of KINDS) of an executed instruction: collectives first, then the
    optimizer update and attention by their name scopes (whatever they compute: a fused
    attention kernel by its custom call's target too), then by what it computes."""
    work = computes(program, inst)
    if work == COLLECTIVE:
        return COLLECTIVE
    op_name = program.op_name(inst)
    if OPTIMIZER_SCOPE in op_name:
        return OPTIMIZER
    if ATTENTION_SCOPE in op_name or ATTENTION_TARGET.search(inst.target):
        return ATTENTION
    return work


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


def _short_op_name(op_name: str, limit: int = 110) -> str:
    """The op_name without jax's transformation wrappers ("backward " before those of the
    backward pass, which jax names transpose(jvp(...))), its tail kept when long."""
    text = re.sub(r"(jit|jvp|transpose|vmap|checkpoint|remat|cond|branch_\d+_fun)\(", "", op_name)
    text = text.replace(")", "")
    if "transpose(jvp(" in op_name:
        text = "backward " + text
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


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
                "op_name": _short_op_name(op_name),
            }
            for name, (total, count, kind, op_name) in longest
        ),
    )


# ----------------------------------------------------------------------------- the program


# An encoder layer's op_name: ".../layer_3/..." unrolled, ".../layers/..." scanned.
_ENCODER_LAYER = re.compile(r"/layers?(_\d+)?/")


def _elements(dims: tuple[int, ...]) -> int:
    return math.prod(dims) if dims else 1


def _scope_label(op_name: str) -> str:
    """Where an op comes from, layers merged: the op_name's module path and primitive."""
    text = _short_op_name(op_name, limit=10_000)
    text = re.sub(r"layer_\d+", "layer_N", text)
    text = re.sub(r"^[^/]*/", "", text) if text.startswith("train_step") else text
    parts = [p for p in text.split("/") if p]
    # Within an encoder layer, from the layer on (whatever scan or remat wrapped it).
    layer = [i for i, part in enumerate(parts) if re.fullmatch(r"layers|layer_N", part)]
    if layer:
        return "/".join(parts[layer[-1] :])
    return "/".join(parts[-4:]) if parts else "(no op_name)"


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes a program's findings are measured against."""

    tokens: int  # batch x sequence length
    hidden: int
    vocab: int
    predictions: int  # masked positions in the batch (batch x per sequence)
    parameter_leaves: int


def program_findings(
    optimised: str, lowered: str, shapes: Shapes, examples: int = 4
) -> dict[str, Any]:
    """What a step's program holds, read without running it: `optimised` is its optimised
    HLO text, `lowered` its HLO before optimisation (both with metadata).

    - the optimizer update: its operations before optimisation and the kernels (executed
      instructions) they became, per parameter leaf;
    - conditionals and loops, by origin (a GPU conditional, and a loop without a known trip
      count, wait for the host at every execution);
    - float32 activations: converts from bfloat16 of at least tokens x hidden elements before
      optimisation, and kernels writing float32 outputs that large after it, by origin;
    - layout changes in attention's scope: transposes before optimisation, transpose and copy
      kernels after it (with their shapes);
    - the masked-LM head: the rows of the forward pass's products a vocabulary wide, outside
      the encoder's layers, before optimisation;
    - the program's size: instructions, kernels, fusions and loops.
    """
    program = Program.parse(optimised)
    before = Program.parse(lowered)
    executed = program.executed()
    activation = shapes.tokens * shapes.hidden
    every_before = [i for comp in before.computations.values() for i in comp]

    optimizer = [i for i in executed if OPTIMIZER_SCOPE in program.op_name(i)]
    control = collections.Counter(
        (i.opcode, _scope_label(i.op_name), i.trip_count)
        for comp in program.computations.values()
        for i in comp
        if i.opcode in ("conditional", "while")
    )

    converts: collections.Counter = collections.Counter()
    for inst in every_before:
        if inst.opcode != "convert" or not inst.operands:
            continue
        source = before.instruction(inst.operands[0])
        (dtype, dims), (source_dtype, _) = (
            inst.arrays()[0],
            (source.arrays()[0] if source and source.arrays() else ("", ())),
        )
        if dtype == "f32" and source_dtype == "bf16" and _elements(dims) >= activation:
            converts[_scope_label(inst.op_name)] += 1
    f32_outputs: collections.Counter = collections.Counter()
    f32_bytes = 0
    large_outputs = 0
    for inst in executed:
        for dtype, dims in inst.arrays():
            if _elements(dims) < activation:
                continue
            large_outputs += 1
            if dtype == "f32":
                f32_outputs[_scope_label(program.op_name(inst))] += 1
                f32_bytes += 4 * _elements(dims)
    transposes_before = [
        i for i in every_before if i.opcode == "transpose" and ATTENTION_SCOPE in i.op_name
    ]
    moves = [
        i
        for i in executed
        if ATTENTION_SCOPE in program.op_name(i) and computes(program, i) == LAYOUT
    ]
    heads = []
    for inst in every_before:
        dims = inst.arrays()[0][1] if inst.opcode in MATMUL_OPS and inst.arrays() else ()
        # The forward pass's products a vocabulary wide, outside the encoder's layers.
        if (
            dims
            and dims[-1] == shapes.vocab
            and "transpose(" not in inst.op_name
            and not _ENCODER_LAYER.search(inst.op_name)
        ):
            heads.append(
                {"shape": inst.shape.split("{")[0], "rows": _elements(dims) // shapes.vocab}
            )

    def top(counter: collections.Counter) -> list[list[Any]]:
        return [[label, count] for label, count in counter.most_common(examples)]

    def shapes_of(instructions: Sequence[Instruction]) -> list[str]:
        counts = collections.Counter(i.shape.split("{")[0] for i in instructions)
        return [f"{count}x {shape}" for shape, count in counts.most_common(examples)]

    return {
        "optimizer_update": {
            "operations": sum(1 for i in every_before if OPTIMIZER_SCOPE in i.op_name),
            "kernels": len(optimizer),
            "fusions": sum(1 for i in optimizer if i.opcode == "fusion"),
            "parameter_leaves": shapes.parameter_leaves,
            "kernels_per_leaf": len(optimizer) / max(1, shapes.parameter_leaves),
        },
        "control_flow": [
            {"opcode": opcode, "origin": origin, "trip_count": trips, "count": count}
            for (opcode, origin, trips), count in control.most_common()
        ],
        "float32_activations": {
            "converts_before_optimisation": sum(converts.values()),
            "converts_by_origin": top(converts),
            "kernel_outputs": sum(f32_outputs.values()),
            "activation_sized_kernel_outputs": large_outputs,
            "kernel_output_gb": f32_bytes / 1e9,
            "kernel_outputs_by_origin": top(f32_outputs),
        },
        "attention_layout": {
            "transposes_before_optimisation": len(transposes_before),
            "shapes_before_optimisation": shapes_of(transposes_before),
            "kernels": len(moves),
            "shapes": shapes_of(moves),
            "layout_kernels_in_program": sum(1 for i in executed if computes(program, i) == LAYOUT),
        },
        "mlm_head": {
            "products": heads[:examples],
            "tokens": shapes.tokens,
            "predictions": shapes.predictions,
            "masked_rows_only": bool(heads) and all(h["rows"] <= shapes.predictions for h in heads),
        },
        "program": {
            "instructions": program.size(),
            "instructions_before_optimisation": before.size(),
            "kernels": len(executed),
            "fusions": sum(1 for i in executed if i.opcode == "fusion"),
            "while_loops": sum(n for (opcode, _, _), n in control.items() if opcode == "while"),
        },
    }


def format_findings(findings: Mapping[str, Any]) -> str:
    """program_findings as printed lines."""
    opt = findings["optimizer_update"]
    f32 = findings["float32_activations"]
    attn = findings["attention_layout"]
    head = findings["mlm_head"]
    size = findings["program"]
    control = findings["control_flow"]
    lines = [
        f"optimizer update: {opt['operations']} operations became {opt['kernels']} kernels "
        f"({opt['fusions']} fusions) for {opt['parameter_leaves']} parameter leaves, "
        f"{opt['kernels_per_leaf']:.1f} per leaf",
        "conditionals and loops: "
        + (
            "; ".join(
                f"{c['count']}x {c['opcode']} {c['origin']}"
                + (f" ({c['trip_count']} trips)" if c["trip_count"] is not None else "")
                for c in control
            )
            or "none"
        ),
        f"float32 activations: {f32['converts_before_optimisation']} converts from bfloat16 "
        f"before optimisation; {f32['kernel_outputs']} of "
        f"{f32['activation_sized_kernel_outputs']} "
        f"activation-sized kernel outputs are float32 ({f32['kernel_output_gb']:.2f} GB)",
    ]
    lines += [f"  converted: {count}x {label}" for label, count in f32["converts_by_origin"]]
    lines += [f"  written: {count}x {label}" for label, count in f32["kernel_outputs_by_origin"]]
    lines.append(
        f"attention: {attn['transposes_before_optimisation']} transposes before optimisation "
        f"({', '.join(attn['shapes_before_optimisation']) or '-'}); {attn['kernels']} "
        f"transpose/copy kernels after it ({', '.join(attn['shapes']) or '-'}); "
        f"{attn['layout_kernels_in_program']} layout kernels in the whole program"
    )
    products = ", ".join(f"{p['rows']} rows" for p in head["products"]) or "no product found"
    lines.append(
        f"masked-LM head: {products} against {head['predictions']} masked positions and "
        f"{head['tokens']} tokens ("
        + ("masked positions only" if head["masked_rows_only"] else "more rows than masked")
        + ")"
    )
    lines.append(
        f"program: {size['instructions']} instructions ({size['instructions_before_optimisation']}"
        f" before optimisation), {size['kernels']} kernels, {size['fusions']} fusions, "
        f"{size['while_loops']} while loops"
    )
    return "\n".join(lines)
