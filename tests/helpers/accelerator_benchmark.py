"""The rows of the tables benchmarks.accelerator prints, and small programs and traces for
benchmarks.harness.hlo and .profile: HLO text as XLA prints it and Chrome traces as jax's
profiler writes them, built line by line."""

from __future__ import annotations

from typing import Any


def table_lines(out: str, columns: tuple[str, ...]) -> list[list[str]]:
    """The rows (split on 2+ spaces) of the printed table whose header is `columns`."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == " ".join(columns).split())
    rows = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        rows.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return rows


# ----------------------------------------------------------------------------- HLO text

FORWARD = "jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0"
BACKWARD = "jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/layer_0"


def instruction(
    name: str, shape: str, call: str, *attributes: str, op_name: str = "", root: bool = False
) -> str:
    """One instruction's line: `%name = shape call, attributes..., metadata={op_name=...}`."""
    parts = [f"%{name} = {shape} {call}", *attributes]
    if op_name:
        parts.append(f'metadata={{op_name="{op_name}"}}')
    return ("  ROOT " if root else "  ") + ", ".join(parts)


def computation(header: str, *lines: str) -> str:
    return "\n".join([f"{header} {{", *lines, "}"])


B48, F88, T2 = "bf16[4,8]{1,0}", "f32[8,8]{1,0}", "(f32[8,8]{1,0}, f32[8,8]{1,0})"
QKV = "bf16[2,4,2,8]{3,2,1,0}"

# A GPU-style optimised train step: a GEMM fusion, cuDNN's fused attention, a cuBLAS call, a
# GELU loop fusion, a transpose, a reduction, a gather, an all-reduce and the optimizer update
# inside the conditional that skips a non-finite step.
GPU_PROGRAM = "\n\n".join(
    [
        "HloModule jit_train_step, is_scheduled=true",
        computation(
            "%gemm_body (p0: bf16[4,8], p1: bf16[8,8]) -> bf16[4,8]",
            instruction("p0", B48, "parameter(0)"),
            instruction("p1", "bf16[8,8]{1,0}", "parameter(1)"),
            instruction(
                "dot.1",
                B48,
                "dot(bf16[4,8]{1,0} %p0, bf16[8,8]{1,0} %p1)",
                "lhs_contracting_dims={1}",
                "rhs_contracting_dims={0}",
                op_name=f"{FORWARD}/mlp/intermediate/dot_general",
                root=True,
            ),
        ),
        computation(
            "%gelu_body (p0.1: bf16[4,8]) -> bf16[4,8]",
            instruction("p0.1", B48, "parameter(0)"),
            instruction("c.1", "f32[4,8]{1,0}", f"convert({B48} %p0.1)"),
            instruction("e.1", "f32[4,8]{1,0}", "erf(f32[4,8]{1,0} %c.1)"),
            instruction("c.2", B48, "convert(f32[4,8]{1,0} %e.1)", root=True),
        ),
        computation(
            "%transpose_body (p0.2: bf16[4,8]) -> bf16[8,4]",
            instruction("p0.2", B48, "parameter(0)"),
            instruction(
                "t.1",
                "bf16[8,4]{1,0}",
                f"transpose({B48} %p0.2)",
                "dimensions={1,0}",
                op_name=f"{BACKWARD}/mlp/transpose",
                root=True,
            ),
        ),
        computation(
            "%add (a: f32[], b: f32[]) -> f32[]",
            instruction("a", "f32[]", "parameter(0)"),
            instruction("b", "f32[]", "parameter(1)"),
            instruction("s", "f32[]", "add(f32[] %a, f32[] %b)", root=True),
        ),
        computation(
            "%reduce_body (p0.3: bf16[4,8]) -> f32[8]",
            instruction("p0.3", B48, "parameter(0)"),
            instruction("c.3", "f32[4,8]{1,0}", f"convert({B48} %p0.3)"),
            instruction("zero", "f32[]", "constant(0)"),
            instruction(
                "r.1",
                "f32[8]{0}",
                "reduce(f32[4,8]{1,0} %c.3, f32[] %zero)",
                "dimensions={0}",
                "to_apply=%add",
                root=True,
            ),
        ),
        computation(
            "%gather_body (p0.4: f32[16,8], p1.4: s32[4,1]) -> f32[4,8]",
            instruction("p0.4", "f32[16,8]{1,0}", "parameter(0)"),
            instruction("p1.4", "s32[4,1]{1,0}", "parameter(1)"),
            instruction(
                "g.1",
                "f32[4,8]{1,0}",
                "gather(f32[16,8]{1,0} %p0.4, s32[4,1]{1,0} %p1.4)",
                "offset_dims={1}",
                "slice_sizes={1,8}",
                root=True,
            ),
        ),
        computation(
            "%update_body (p0.5: f32[8,8], p1.5: f32[8,8]) -> f32[8,8]",
            instruction("p0.5", F88, "parameter(0)"),
            instruction("p1.5", F88, "parameter(1)"),
            instruction(
                "m.1",
                F88,
                f"multiply({F88} %p0.5, {F88} %p1.5)",
                op_name="jit(train_step)/cond/branch_1_fun/optimizer_update/mul",
                root=True,
            ),
        ),
        computation(
            "%skip (p.6: (f32[8,8], f32[8,8])) -> f32[8,8]",
            instruction("p.6", T2, "parameter(0)"),
            instruction("old", F88, f"get-tuple-element({T2} %p.6)", "index=0", root=True),
        ),
        computation(
            "%apply (p.7: (f32[8,8], f32[8,8])) -> f32[8,8]",
            instruction("p.7", T2, "parameter(0)"),
            instruction("w", F88, f"get-tuple-element({T2} %p.7)", "index=0"),
            instruction("g", F88, f"get-tuple-element({T2} %p.7)", "index=1"),
            instruction(
                "loop_update_fusion.1",
                F88,
                f"fusion({F88} %w, {F88} %g)",
                "kind=kLoop",
                "calls=%update_body",
                root=True,
            ),
        ),
        computation(
            "ENTRY %main.9 (x: bf16[4,8], w: bf16[8,8]) -> (f32[8,8], /*index=1*/f32[8])",
            instruction("x", B48, "parameter(0)"),
            instruction("w.1", "bf16[8,8]{1,0}", "parameter(1)"),
            instruction("q", QKV, "parameter(2)"),
            instruction("table", "f32[16,8]{1,0}", "parameter(3)"),
            instruction("ids", "s32[4,1]{1,0}", "parameter(4)"),
            instruction("p", F88, "parameter(5)"),
            instruction("pred", "pred[]", "parameter(6)"),
            instruction(
                "gemm_fusion",
                B48,
                "fusion(bf16[4,8]{1,0} %x, bf16[8,8]{1,0} %w.1)",
                "kind=kCustom",
                "calls=%gemm_body",
                op_name=f"{FORWARD}/mlp/intermediate/dot_general",
            ),
            instruction(
                "custom-call.1",
                "(bf16[2,4,2,8]{3,2,1,0}, u8[0]{0})",
                f"custom-call({QKV} %q, {QKV} %q, {QKV} %q)",
                'custom_call_target="__cudnn$fmhaSoftmax"',
                op_name=f"{FORWARD}/attention/dot_product_attention/dot_product_attention",
            ),
            instruction(
                "custom-call.2",
                "bf16[8,8]{1,0}",
                "custom-call(bf16[8,8]{1,0} %w.1, bf16[8,8]{1,0} %w.1)",
                'custom_call_target="__cublas$gemm"',
            ),
            instruction(
                "loop_gelu_fusion",
                B48,
                f"fusion({B48} %gemm_fusion)",
                "kind=kLoop",
                "calls=%gelu_body",
                op_name=f"{FORWARD}/mlp/erf",
            ),
            instruction(
                "transpose_fusion",
                "bf16[8,4]{1,0}",
                f"fusion({B48} %loop_gelu_fusion)",
                "kind=kLoop",
                "calls=%transpose_body",
            ),
            instruction(
                "input_reduce_fusion",
                "f32[8]{0}",
                f"fusion({B48} %loop_gelu_fusion)",
                "kind=kInput",
                "calls=%reduce_body",
                op_name=f"{BACKWARD}/mlp/intermediate/reduce_sum",
            ),
            instruction(
                "gather_fusion",
                "f32[4,8]{1,0}",
                "fusion(f32[16,8]{1,0} %table, s32[4,1]{1,0} %ids)",
                "kind=kInput",
                "calls=%gather_body",
            ),
            instruction(
                "all-reduce-start",
                "f32[8]{0}",
                "all-reduce-start(f32[8]{0} %input_reduce_fusion)",
                "to_apply=%add",
            ),
            instruction(
                "all-reduce-done", "f32[8]{0}", "all-reduce-done(f32[8]{0} %all-reduce-start)"
            ),
            instruction("operands", T2, f"tuple({F88} %p, {F88} %p)"),
            instruction(
                "cond.5",
                F88,
                f"conditional(pred[] %pred, {T2} %operands, {T2} %operands)",
                "true_computation=%apply",
                "false_computation=%skip",
                op_name="jit(train_step)/cond",
            ),
            instruction(
                "out",
                "(f32[8,8]{1,0}, f32[8]{0})",
                f"tuple({F88} %cond.5, f32[8]{{0}} %all-reduce-done)",
                root=True,
            ),
        ),
    ]
)

# The same step before optimisation (jax's HLO: names without '%'): two LayerNorm converts
# from bfloat16 as large as a hidden state and one too small to count, a transpose in
# attention, the masked-LM head (12 rows) and an encoder product as wide as the vocabulary.
LOWERED_PROGRAM = "\n".join(
    [
        "HloModule jit_train_step, entry_computation_layout={()->f32[]}",
        "",
        computation(
            "ENTRY main.1",
            instruction("h.1", "bf16[4,16,8]{2,1,0}", "parameter(0)"),
            instruction(
                "ln.1",
                "f32[4,16,8]{2,1,0}",
                "convert(h.1)",
                op_name=f"{FORWARD}/attention/layer_norm/convert_element_type",
            ),
            instruction(
                "ln.2",
                "f32[4,16,8]{2,1,0}",
                "convert(h.1)",
                op_name=f"{FORWARD[:-1]}1/attention/layer_norm/convert_element_type",
            ),
            instruction("w.1", F88, "parameter(1)"),
            instruction(
                "small.1",
                "bf16[8,8]{1,0}",
                "convert(w.1)",
                op_name=f"{FORWARD}/mlp/convert_element_type",
            ),
            instruction("t.1", "bf16[4,2,16,4]{3,2,1,0}", "parameter(2)"),
            instruction(
                "tr.1",
                "bf16[4,16,2,4]{3,2,1,0}",
                "transpose(t.1)",
                "dimensions={0,2,1,3}",
                op_name=f"{FORWARD}/attention/dot_product_attention/transpose",
            ),
            instruction("m.1", "bf16[4,3,8]{2,1,0}", "parameter(3)"),
            instruction("e.1", "bf16[8,50]{1,0}", "parameter(4)"),
            instruction(
                "logits.1",
                "f32[4,3,50]{2,1,0}",
                "dot(m.1, e.1)",
                "lhs_contracting_dims={2}",
                "rhs_contracting_dims={0}",
                op_name="jit(train_step)/jvp(BertForPreTraining)/mlm_head/dot_general",
            ),
            instruction(
                "wi.1",
                "f32[4,16,50]{2,1,0}",
                "dot(h.1, e.1)",
                "lhs_contracting_dims={2}",
                "rhs_contracting_dims={0}",
                op_name=f"{FORWARD}/mlp/wi/dot_general",
                root=True,
            ),
        ),
    ]
)

# ----------------------------------------------------------------------------- traces

# GPU_PROGRAM's kernels in one step: (kernel name, hlo_op, start, duration), microseconds.
# 40 us idle before the update (the conditional waiting for the host).
GPU_STEP_KERNELS = (
    ("gemm_fusion", "gemm_fusion", 0, 100),
    ("cudnn_generated_fort_native_sdpa_sm90", "custom-call.1", 100, 150),
    ("loop_gelu_fusion", "loop_gelu_fusion", 250, 50),
    ("transpose_fusion", "transpose_fusion", 300, 20),
    ("input_reduce_fusion", "input_reduce_fusion", 320, 40),
    ("loop_update_fusion_1", "loop_update_fusion.1", 400, 80),
    ("sm90_xmma_gemm_bf16bf16", "custom-call.2", 480, 20),
)


def _metadata(pid: int, name: str, tid: int | None = None) -> dict[str, Any]:
    kind = "process_name" if tid is None else "thread_name"
    event = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
    return event if tid is None else {**event, "tid": tid}


def _event(pid: int, tid: int, ts: float, dur: float, name: str, **args: str) -> dict[str, Any]:
    event = {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name}
    return {**event, "args": args} if args else event


def gpu_trace(steps: int, step_us: float, device: int = 0) -> list[dict[str, Any]]:
    """A GPU trace of GPU_PROGRAM's `steps` steps as jax's profiler writes it: kernels on a
    compute stream, the next batch's copy on another (half of it under the update), the
    module's executions on "XLA Modules", the derived "XLA Ops" line (duplicates that must
    not count), another program's kernel and a host thread's event. `device` is the GPU's
    ordinal (its process id is one more)."""
    gpu = device + 1
    events = [
        _metadata(gpu, f"/device:GPU:{device}"),
        _metadata(gpu, "Stream #7(compute)", 7),
        _metadata(gpu, "Stream #8(H2D)", 8),
        _metadata(gpu, "XLA Modules", 2),
        _metadata(gpu, "XLA Ops", 3),
        _metadata(9, "/host:CPU"),
    ]
    step_kernel = {"hlo_module": "jit_train_step"}
    for step in range(steps):
        t0 = step * step_us
        events.append(_event(gpu, 2, t0, 500, "jit_train_step(42)"))
        for name, hlo_op, start, duration in GPU_STEP_KERNELS:
            for tid in (7, 3):
                events.append(
                    _event(gpu, tid, t0 + start, duration, name, hlo_op=hlo_op, **step_kernel)
                )
        copy = {"memcpy_details": "kind_src:pinned size:4096"}
        events.append(_event(gpu, 8, t0 + 450, 100, "MemcpyH2D", **copy))
        other = {"hlo_op": "add_fusion", "hlo_module": "jit_copy"}
        events.append(_event(gpu, 7, t0 + 600, 10, "loop_add_fusion", **other))
        events.append(_event(9, 1, t0, 30, "PjitFunction(train_step)"))
    return events


def cpu_trace(steps: int, step_us: float, device: int = 0) -> list[dict[str, Any]]:
    """A CPU trace of GPU_PROGRAM's steps as XLA's CPU runtime writes its thunks: run ids per
    execution, the conditional's thunk holding its branch's, and bookkeeping markers, on the
    simulated CPU device `device` (on its own thread)."""
    thread = 1 + device
    events = [_metadata(5, "tf_XLAPjRtCpuClient", thread)]
    for step in range(steps):
        t0, run = step * step_us + device, str(100 + step)
        for name, start, duration in (
            ("gemm_fusion", 0, 300),
            ("cond.5", 300, 200),
            ("loop_update_fusion.1", 350, 100),
        ):
            args = {"hlo_op": name, "hlo_module": "jit_train_step", "run_id": run}
            args["device_ordinal"] = str(device)
            events.append(_event(5, thread, t0 + start, duration, name, **args))
        events.append(_event(5, thread, t0 + 460, 1, "end: loop_update_fusion.1"))
    return events
