"""What a compiled step holds: XLA's HLO text parsed into instructions, each sorted into a kind
of work, and the findings a program gives without running it.

The optimised HLO text (`compiled.as_text()`) gives each instruction its opcode, shape, the
computations it calls and `metadata={op_name=...}`, jax's name stack, which carries
bertjax's name scopes: bertjax.nn.attention.SCOPE around attention, whichever backend
computes it, and bertjax.engine.steps.OPTIMIZER_SCOPE around the optimizer update. The text
before optimisation (`lowered.as_text(dialect="hlo", debug_info=True)`) is parsed alike.

`classify` sorts an executed instruction into one of KINDS (benchmarks.harness.profile
times them from a trace); `program_findings` reads what an optimised program holds without
running it: the optimizer update's kernels, conditionals and loops, float32 activations,
transposes in attention, the masked-LM head's rows, the program's size.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

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
INPUT = "input transfer"  # host-to-device copies: only a trace has them
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

COLLECTIVE_OPS = frozenset(
    "all-reduce all-gather reduce-scatter all-to-all collective-permute collective-broadcast "
    "ragged-all-to-all send recv".split()
)
MATMUL_OPS = frozenset(("dot", "convolution", "ragged-dot", "scaled-dot"))
GATHER_OPS = frozenset(("gather", "scatter"))
REDUCE_OPS = frozenset(("reduce", "reduce-window", "select-and-scatter", "sort"))
# Data movement without arithmetic.
LAYOUT_OPS = frozenset(
    "transpose copy copy-start copy-done bitcast-convert reshape slice concatenate pad "
    "dynamic-slice dynamic-update-slice reverse broadcast".split()
)
# No device work of their own.
TRIVIAL_OPS = frozenset(
    "parameter constant get-tuple-element tuple bitcast after-all partition-id replica-id "
    "opt-barrier add-dependency domain async-done async-update".split()
)
# Run the computations they call; the called instructions are the kernels.
CONTROL_OPS = frozenset(("conditional", "while", "call", "async-start"))
# Of those, the ones whose called computations are control flow, not one operation's body.
BRANCHING_OPS = frozenset(("conditional", "while", "call"))
# Custom calls by target: cuDNN's fused attention, the matrix-product libraries.
ATTENTION_TARGET = re.compile(r"fmha|flash|sdpa|attention", re.IGNORECASE)
MATMUL_TARGET = re.compile(r"gemm|cublas|matmul|onednn", re.IGNORECASE)
# Random bits (dropout's masks) by a custom call on some platforms: elementwise work.
RANDOM_TARGET = re.compile(r"threefry|philox|rng", re.IGNORECASE)


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


def short_op_name(op_name: str, limit: int = 110) -> str:
    """The op_name without jax's transformation wrappers ("backward " before those of the
    backward pass, which jax names transpose(jvp(...))), its tail kept when long."""
    text = re.sub(r"(jit|jvp|transpose|vmap|checkpoint|remat|cond|branch_\d+_fun)\(", "", op_name)
    text = text.replace(")", "")
    if "transpose(jvp(" in op_name:
        text = "backward " + text
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


# ----------------------------------------------------------------------------- the program


# An encoder layer's op_name: ".../layer_3/..." unrolled, ".../layers/..." scanned.
_ENCODER_LAYER = re.compile(r"/layers?(_\d+)?/")


def _elements(dims: tuple[int, ...]) -> int:
    return math.prod(dims) if dims else 1


def _scope_label(op_name: str) -> str:
    """Where an op comes from, layers merged: the op_name's module path and primitive."""
    text = short_op_name(op_name, limit=10_000)
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
