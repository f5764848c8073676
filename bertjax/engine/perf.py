"""Throughput accounting: model FLOPs per sequence, accelerator peaks, a matmul probe.

Model FLOPs utilisation (MFU) = achieved model FLOP/s / peak FLOP/s. The model FLOPs are
those of the matmuls the architecture needs (rematerialisation is not counted), so MFU
compares runs with different implementations fairly.
"""

from __future__ import annotations

import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

# Dense (no structured sparsity) peak matmul FLOP/s per chip, from the vendors' data sheets.
# "float32" is the IEEE float32 rate of the CUDA cores; "tfloat32" the tensor-core rate of
# float32 inputs rounded to tf32. TPUs have no float32 matmul unit: their float32 matmuls
# are bfloat16 passes (see peak_flops_per_device), so only "bfloat16" is listed.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "TPU v2": {"bfloat16": 45e12},
    "TPU v3": {"bfloat16": 123e12},
    "TPU v4": {"bfloat16": 275e12},
    "TPU v5e": {"bfloat16": 197e12},
    "TPU v5p": {"bfloat16": 459e12},
    "TPU v6e": {"bfloat16": 918e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "tfloat32": 156e12, "float32": 19.5e12},
    "H100 SXM": {"bfloat16": 989e12, "float16": 989e12, "tfloat32": 494.5e12, "float32": 67e12},
    "H100 PCIe": {"bfloat16": 756e12, "float16": 756e12, "tfloat32": 378e12, "float32": 51e12},
    "H200": {"bfloat16": 989e12, "float16": 989e12, "tfloat32": 494.5e12, "float32": 67e12},
}

# jax device_kind strings (normalised: lower case, "-"/"_" as spaces) -> PEAK_FLOPS key.
# Order matters: the first match wins ("tpu v5 lite" before "tpu v5").
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\btpu v6 ?(lite|e\b)|trillium", "TPU v6e"),
    (r"\btpu v5 ?(lite|e\b)", "TPU v5e"),
    (r"\btpu v5 ?p?\b", "TPU v5p"),
    (r"\btpu v4\b(?! lite)", "TPU v4"),
    (r"\btpu v3\b", "TPU v3"),
    (r"\btpu v2\b", "TPU v2"),
    (r"h200", "H200"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h100", "H100 SXM"),
    (r"a100", "A100"),
)

# jax's matmul precision names -> the number of bfloat16 passes a TPU makes for a float32
# matmul, and whether a GPU may use tf32 tensor cores (jax.lax.Precision's documentation).
_PRECISIONS: dict[str, tuple[int, bool]] = {
    "default": (1, True),
    "fastest": (1, True),
    "bfloat16": (1, True),
    "high": (3, True),
    "tensorfloat32": (3, True),
    "bfloat16_3x": (3, True),
    "highest": (6, False),
    "float32": (6, False),
}


def training_flops_per_sequence(
    config,
    seq_len: int,
    num_predictions: int,
    *,
    feed_forward_matrices: int = 2,
    sentence_pair_head: bool = True,
) -> float:
    """Matmul FLOPs to train on one sequence: forward, backward and weight gradients.

    With H = hidden_size, F = intermediate_size, L = num_layers, V = vocab_size, S = seq_len,
    P = num_predictions, M = feed_forward_matrices ([H, F] matrices per feed-forward: BERT's
    2, a gated one's 3) and 2 FLOPs per multiply-add, the forward pass is

      per token and layer:  2 * 4 * H * H      query, key, value and output projections
                          + 2 * M * H * F      feed-forward
                          + 2 * 2 * S * H      attention scores (QK^T) and weighted values
      per sequence:         2 * H * H + 2 * H * 2        pooler and NSP classifier (if any)
      per prediction:       2 * H * H + 2 * H * V        MLM transform and tied decoder

      forward = S * L * (8 H^2 + 2 M H F + 4 S H) + [2 H^2 + 4 H] + P * (2 H^2 + 2 H V)

    and training costs 3 * forward (the backward pass takes 2x the forward: gradients with
    respect to activations and to weights). Embedding lookups, softmax, layer norms and
    activations are not matmuls and are left out; the MLM head runs only on the P predicted
    positions, as in google-research/bert. Attention is counted over the whole sequence in
    every layer, sliding-window layers too (they compute it and mask).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is invalid; must be >= 1")
    if num_predictions < 0:
        raise ValueError(f"num_predictions={num_predictions!r} is invalid; must be >= 0")
    h = float(config.hidden_size)
    f = float(config.intermediate_size)
    v = float(config.vocab_size)
    layers = float(config.num_layers)
    s = float(seq_len)
    per_token_layer = 8 * h * h + 2 * feed_forward_matrices * h * f + 4 * s * h
    encoder = s * layers * per_token_layer
    pooler_and_nsp = 2 * h * h + 2 * h * 2 if sentence_pair_head else 0.0
    mlm = num_predictions * (2 * h * h + 2 * h * v)
    return 3.0 * (encoder + pooler_and_nsp + mlm)


def device_family(device_kind: str) -> str | None:
    """The PEAK_FLOPS key for a jax `device_kind` string, or None if unknown."""
    normalised = " ".join(re.sub(r"[-_]", " ", device_kind.lower()).split())
    for pattern, key in _DEVICE_PATTERNS:
        if re.search(pattern, normalised):
            return key
    return None


def peak_flops_per_device(
    device_kind: str | None = None,
    dtype: str = "bfloat16",
    override: float | None = None,
    *,
    precision: str | None = None,
) -> float | None:
    """Dense peak matmul FLOP/s of one chip for a compute dtype, or None if unknown.

    `device_kind` defaults to that of jax's first device; `override` (> 0) wins over the
    table. For dtype "float32" the rate follows jax's matmul precision (`precision`, else
    jax's `jax_default_matmul_precision`, else "default"): at default and high precision
    GPUs with tensor cores run float32 matmuls as tf32 and TPUs as 1 or 3 bfloat16 passes;
    at highest precision GPUs use their float32 cores and TPUs 6 bfloat16 passes.
    """
    if override is not None:
        if not override > 0:
            raise ValueError(f"override={override!r} is invalid; must be a FLOP/s rate > 0")
        return float(override)
    dtype = str(jnp.dtype(dtype))
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(
            f"dtype={dtype!r} is invalid; valid values are 'bfloat16', 'float16', 'float32'"
        )
    if device_kind is None:
        device_kind = jax.devices()[0].device_kind
    family = device_family(device_kind)
    if family is None:
        return None
    peaks = PEAK_FLOPS[family]
    if dtype != "float32":
        return peaks.get(dtype)

    if precision is None:
        precision = jax.config.jax_default_matmul_precision or "default"
    passes_and_tf32 = _PRECISIONS.get(str(precision).lower())
    if passes_and_tf32 is None:
        return None  # an explicit algorithm we have no figure for
    tpu_passes, may_use_tf32 = passes_and_tf32
    if "float32" not in peaks and "tfloat32" not in peaks:
        return peaks["bfloat16"] / tpu_passes
    if may_use_tf32 and "tfloat32" in peaks:
        return peaks["tfloat32"]
    return peaks.get("float32")


def measure_matmul_flops(dtype: str = "float32", size: int = 1024, repeats: int = 10) -> float:
    """Achieved FLOP/s of a jitted [size, size] x [size, size] matmul on the default backend."""
    if size < 1:
        raise ValueError(f"size={size!r} is invalid; must be >= 1")
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid; must be >= 1")
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((size, size)), jnp.dtype(dtype))
    b = jnp.asarray(rng.standard_normal((size, size)), jnp.dtype(dtype))
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile outside the timed region
    start = time.perf_counter()
    for _ in range(repeats):
        out = matmul(a, b)
    out.block_until_ready()
    elapsed = time.perf_counter() - start
    return 2.0 * size**3 * repeats / elapsed


class Throughput:
    """Sequences/s, tokens/s and MFU over each logging interval, compilation excluded."""

    def __init__(
        self,
        batch_size: int,
        seq_len: int,
        flops_per_sequence: float,
        peak_flops_per_device: float | None,
        step: int,
    ):
        self._batch_size = batch_size
        self._seq_len = seq_len
        self._flops_per_sequence = flops_per_sequence
        self._total_peak = (
            peak_flops_per_device * jax.device_count() if peak_flops_per_device else None
        )
        self.restart(step)

    def restart(self, step: int) -> None:
        self._start, self._step = time.time(), step

    def metrics(self, step: int) -> dict[str, float]:
        """Figures since the last restart (call after the device has finished `step`)."""
        if step == self._step:  # nothing timed yet (the interval was the compiling step)
            return {}
        elapsed = max(time.time() - self._start, 1e-9)
        sequences_per_sec = (step - self._step) * self._batch_size / elapsed
        out = {
            "perf/sequences_per_sec": sequences_per_sec,
            "perf/tokens_per_sec": sequences_per_sec * self._seq_len,
        }
        if self._total_peak:
            out["perf/mfu"] = self._flops_per_sequence * sequences_per_sec / self._total_peak
        self.restart(step)
        return out


# The events jax records while turning a traced function into a program.
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
# Recorded when a program is loaded from the persistent compilation cache instead.
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileTime:
    """Seconds spent tracing, lowering and compiling while the context is open, and the
    programs compiled (`programs`) or loaded from jax's persistent compilation cache
    (`loaded`; bertjax.engine.compilation_cache).

    A fine-tuning run compiles one train and one eval program per length bucket it meets;
    on CPU that is a visible share of a short run, which the end-of-run summary reports.
    A program read back from the cache counts its tracing and its loading in `seconds`.
    Programs compiled in other threads while the context is open count too.
    """

    def __init__(self):
        self.seconds = 0.0
        self.programs = 0
        self.loaded = 0
        self._lock = threading.Lock()

    def _listen(self, event: str, duration: float, **_) -> None:
        if event in _COMPILE_EVENTS:
            with self._lock:
                self.seconds += duration
                self.programs += event == _COMPILE_EVENTS[-1]

    def _count_hits(self, event: str, **_) -> None:
        if event == _CACHE_HIT_EVENT:
            with self._lock:
                # jax times a load as a compile: it was counted as one.
                self.loaded += 1
                self.programs -= 1

    def __enter__(self) -> CompileTime:
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        jax.monitoring.register_event_listener(self._count_hits)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listen)
        jax.monitoring.unregister_event_listener(self._count_hits)


# On a CPU a forward pass costs more per token once a call holds more than a few thousand
# tokens: the layers' activations ([tokens, intermediate] and each row's attention scores)
# no longer stay in the cache. A MiniLM-sized BERT (L6/H384/A12) on two cores, forward time
# of 32 rows at once against the same rows run as a loop of smaller calls, ms:
#   32 x 128 tokens: 509-544 at once, 268-308 as calls of 4 to 16 rows;
#   32 x 352 tokens: 1,589 at once, 907-934 as calls of 2 to 8 rows (1,394 as rows one by one).
# So on a CPU evaluation and notebook batches are cut into calls of at most this many tokens
# per device; accelerators, whose throughput grows with the batch, keep the whole batch.
CPU_TOKENS_PER_CALL = 2048


def rows_per_call(length: int, rows: int, multiple: int = 1, platform: str | None = None) -> int:
    """How many of `rows` rows of `length` tokens one forward call should hold.

    `multiple`: the call's rows must be a multiple of it (the mesh's data-parallel size; the
    budget is per device). On a CPU (`platform`, default jax's first device's): the largest
    power of two times `multiple` within CPU_TOKENS_PER_CALL tokens per device, at least
    `multiple`; elsewhere all `rows`.
    """
    if platform is None:
        platform = jax.devices()[0].platform
    if platform != "cpu":
        return rows
    per_device = max(1, CPU_TOKENS_PER_CALL // max(1, length))
    per_device = 1 << (per_device.bit_length() - 1)  # a power of two: few distinct shapes
    return max(multiple, min(rows, per_device * multiple))
