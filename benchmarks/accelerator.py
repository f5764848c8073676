"""Accelerator benchmark: BERT and ModernBERT pretraining steps per attention backend.

    python -m benchmarks.accelerator                      # GPU or TPU: within a budget, < 8 min
    python -m benchmarks.accelerator --models modernbert_base   # ModernBERT alone
    python -m benchmarks.accelerator --json accel.json    # also write the figures as JSON
    python -m benchmarks.accelerator --tiny               # CPU: tiny models (automatic on CPU)
    python -m benchmarks.accelerator --profile prof       # also each step's HLO, trace, breakdown

For BERT-base and BERT-large (configs/base.py, configs/large.py: AdamW, bf16 compute, large
with scanned layers and "dots" rematerialisation) at sequence 128 and 512, and ModernBERT-base
(configs/modernbert_base.py: 22 layers, a global layer every third and sliding windows of
+-64 between, StableAdamW, scanned layer groups, "dots" rematerialisation) at 1,024, times
bertjax's real pretraining train step (bertjax.engine.steps: forward, backward and optimizer update;
BERT's MLM + NSP, ModernBERT's masked LM alone) with each attention backend: "xla" and the
device's fused kernel ("cudnn" flash attention on an NVIDIA GPU, "splash" on a TPU). It
prints the train state's initialisation time ("init s": compiled once per model, length and
layout and shared by its backends, "-" on the second), the train step's compile time, step
time, sequences/s, tokens/s, model FLOP/s and MFU (bertjax.engine.perf's
model-FLOP count against the data-sheet peak of the device; "n/a" for a device not in the
table unless --peak_flops is given).

ModernBERT is timed on two layouts of rows: "padded" (as BERT's batches) and "packed" (whole
documents end to end, with document ids and positions restarting at each, as its recipe
trains). Its global and local layers choose their backend apart (bertjax.encoders.modernbert):
splash serves both kinds and documents; cuDNN serves global layers of padded rows only (jax's
cuDNN attention takes neither a two-sided window nor documents), so on a GPU the padded cell
runs cuDNN in its global layers (the note names the layers left on xla) and the packed cell,
all xla, is skipped with the reason.

Before each model's timings (each layout's, for ModernBERT) it checks the fused backend
against xla on one batch with padding (at the longest sequence length): the MLM (and NSP)
logits, the encoder output at real tokens, the loss, and the gradient of the loss with respect
to every parameter (all as one vector, and the worst single leaf). Errors are relative L2
norms, ||fused - xla|| / ||xla||; the largest absolute difference is printed beside them.
Both backends run in bf16, so they cannot agree exactly: the check also runs xla in float32
(matmuls at "highest" precision) to measure bf16's own error on that batch, and a quantity
passes when the fused-vs-xla error is within max(floor, 3 x that bf16 error), the floor being
2e-2 for outputs and 5e-2 for gradients.

Attention dropout is set to 0 for every backend: the fused kernels cannot drop attention
weights (bertjax.nn.attention runs xla whenever it is active), and the backends must compute the
same function to be compared. Hidden dropout stays at the configs' (BERT's 0.1, ModernBERT's
0). Token packing is off (token_capacity 1), so MFU counts every padded slot as work. Batches
are synthetic (benchmarks.harness.fixtures): random token ids; padded batches have 90% of
sequences full length and the rest between a quarter and all of it (as google's
create_pretraining_data fills sequences); packed rows hold documents of a sixteenth to half a
row. Each cell's first step (which compiles) is timed apart, then --warmup untimed steps, then
one call of --steps steps (benchmarks.harness.timing); --json appends the run's row
(benchmarks.harness.report). Predictions per sequence: S * 5 / 32 for
BERT (20 at 128, 80 at 512), 30% of S for ModernBERT (its recipe's rate); batch 256 at
sequence 128, 64 at 512 and 32 at 1,024 (32k tokens a step).

A global time budget (--budget_s, default 390 s) keeps the run under 8 minutes on one device:
a piece of work (a model's check or one cell) that is not expected to finish within it is
skipped with a note. Compilation dominates the run; the timed steps take seconds. On one
H100 the whole grid does not fit: BERT-base's check and three cells took the default budget
(a cell 70-80 s, of it 20-30 s compiling the step; that was before the initial state was
shared). Split it by model (--models base / large / modernbert_base, one call each) to see
every row. To rerun
faster, give jax a persistent compilation cache (JAX_COMPILATION_CACHE_DIR=<dir> in the
environment): the "compile s" column then counts loading from it.

With --profile each cell also writes its optimised train step (train_step.hlo.txt), a
jax.profiler trace of PROFILED_STEPS more steps and the breakdown of a steady one by kind
(breakdown.json, printed: benchmarks.harness.profile) to a folder named after the cell.
benchmarks.profile_step profiles the two steps furthest from the peak in one call, with the
training loop's input copies and host gaps, and reads their programs.

On CPU the fused kernels do not exist; with --tiny (automatic on CPU) the models are BERT
L2/H64/A2 and ModernBERT L4/H128/A4 (configs/modernbert_tiny.py, windows of +-32), both with
a 512-word vocabulary, at 128 tokens, and "--fused splash" runs the TPU splash kernel in
Pallas interpret mode so that the backend comparison is exercised there too (its timings
mean nothing). Without a fused backend the table has xla rows only and says why.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import commands, fixtures, profile, report, timing
from bertjax import encoders
from bertjax.encoders.bert.model import BertForPreTraining, pretraining_init
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine import perf, steps
from bertjax.nn import attention, losses, sharding
from bertjax.pretrain import objectives
from bertjax.pretrain.objective import MaskedLmLoss, build_pretraining
from bertjax.pretrain.settings import PretrainSettings

DTYPE = "bfloat16"
MODERN_BASE = "modernbert_base"
MODELS = ("base", "large", MODERN_BASE)
TINY_MODEL = "tiny"
MODERN_TINY = "modernbert_tiny"
TINY_MODELS = (TINY_MODEL, MODERN_TINY)
# Each model's sequence lengths unless --seq_lens names them: google's two for BERT,
# ModernBERT-base's phase-1 length (its configs/modernbert_base.py), 128 for the tiny ones.
DEFAULT_SEQ_LENS = {
    "base": (128, 512),
    "large": (128, 512),
    MODERN_BASE: (1024,),
    TINY_MODEL: (128,),
    MODERN_TINY: (128,),
}
# How a batch's rows are filled: google's padded sentence pairs, or whole documents packed
# end to end (ModernBERT's data.layout="packed": document ids and restarting positions).
PADDED = "padded"
PACKED = "packed"
# ModernBERT's recipe masks 30% of the tokens (configs/modern_recipe.py).
MODERN_MASKING_RATE = 0.3
MODERN_VOCAB = 50368
FUSED_CHOICES = ("auto", "cudnn", "splash", "none")
# Tolerance floors of the backend check, relative L2 error (see the module docstring).
OUTPUT_TOLERANCE = 2e-2
GRADIENT_TOLERANCE = 5e-2
NOISE_FACTOR = 3.0
# A gradient leaf whose float32 RMS is below this fraction of the whole gradient's is ~zero.
ZERO_GRADIENT_RMS = 1e-3
# Tokens per batch of the default batch sizes: 256 x 128 = 64 x 512.
TOKENS_PER_BATCH = 32768
# Steps traced per cell by --profile, after the timed ones: two complete steps and the one
# that ends the second.
PROFILED_STEPS = 3
TINY_OVERRIDES = dict(hidden_size=64, num_heads=2, intermediate_size=256)
TINY_VOCAB = 512

COLUMNS = (
    "model",
    "seq",
    "layout",
    "batch",
    "attention",
    "init s",
    "compile s",
    "step ms",
    "seq/s",
    "tokens/s",
    "TFLOP/s",
    "MFU",
    "note",
)
CHECK_COLUMNS = (
    "model",
    "seq",
    "layout",
    "quantity",
    "max abs err",
    "rel err",
    "bf16 err",
    "tol",
    "result",
)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One timed (model, sequence length, attention backend) configuration."""

    model: str
    seq_len: int
    batch_size: int
    attention: str  # the backend asked for
    layout: str = PADDED
    init_s: float | None = None  # the train state's initialisation, compile included
    compile_s: float | None = None
    step_s: float | None = None
    flops_per_sequence: float = 0.0
    peak_flops: float | None = None  # of all devices together
    note: str = ""

    @property
    def sequences_per_sec(self) -> float | None:
        return self.batch_size / self.step_s if self.step_s else None

    @property
    def tokens_per_sec(self) -> float | None:
        rate = self.sequences_per_sec
        return rate * self.seq_len if rate else None

    @property
    def flops_per_sec(self) -> float | None:
        rate = self.sequences_per_sec
        return rate * self.flops_per_sequence if rate else None

    @property
    def mfu(self) -> float | None:
        flops = self.flops_per_sec
        return flops / self.peak_flops if flops and self.peak_flops else None

    def row(self) -> tuple[str, ...]:
        def fmt(x: float | None, spec: str, scale: float = 1.0) -> str:
            return "-" if x is None else format(x * scale, spec)

        return (
            self.model,
            str(self.seq_len),
            self.layout,
            str(self.batch_size),
            self.attention,
            fmt(self.init_s, ".1f"),
            fmt(self.compile_s, ".1f"),
            fmt(self.step_s, ".2f", 1e3),
            fmt(self.sequences_per_sec, ".1f"),
            fmt(self.tokens_per_sec, ".0f"),
            fmt(self.flops_per_sec, ".2f", 1e-12),
            "n/a" if self.step_s and self.mfu is None else fmt(self.mfu, ".1%"),
            self.note,
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            sequences_per_sec=self.sequences_per_sec,
            tokens_per_sec=self.tokens_per_sec,
            flops_per_sec=self.flops_per_sec,
            mfu=self.mfu,
        )
        return out


@dataclasses.dataclass(frozen=True)
class Check:
    """The fused backend against xla for one quantity on one batch."""

    model: str
    seq_len: int
    quantity: str
    max_abs_error: float
    rel_error: float  # ||fused - xla|| / ||xla||; the largest over leaves for gradients
    bf16_error: float  # ||xla bf16 - xla float32|| / ||xla float32||, the same way
    tolerance: float
    layout: str = PADDED

    @property
    def passed(self) -> bool:
        return bool(self.rel_error <= self.tolerance)

    def row(self) -> tuple[str, ...]:
        return (
            self.model,
            str(self.seq_len),
            self.layout,
            self.quantity,
            f"{self.max_abs_error:.3g}",
            f"{self.rel_error:.3g}",
            f"{self.bf16_error:.3g}",
            f"{self.tolerance:.3g}",
            "PASS" if self.passed else "FAIL",
        )

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


# ----------------------------------------------------------------------------- arguments


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise SystemExit(f"{flag}={text!r} is invalid: give positive integers like 128,512")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help=(
            "tiny models (BERT L2/H64/A2 and ModernBERT L4/H128/A4, vocabulary 512); automatic "
            "when the backend is cpu"
        ),
    )
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated, from {MODELS} (default: all; {TINY_MODELS} with --tiny)",
    )
    parser.add_argument(
        "--seq_lens",
        default=None,
        help=(
            "comma-separated, for every model (default: 128,512 for BERT, 1024 for ModernBERT; "
            "128 with --tiny)"
        ),
    )
    parser.add_argument(
        "--batch_size",
        type=int,
        default=0,
        help=f"global batch for every cell (default: {TOKENS_PER_BATCH} tokens / seq; 8 tiny)",
    )
    parser.add_argument(
        "--fused",
        default="auto",
        choices=FUSED_CHOICES,
        help="the fused backend beside xla (auto: cudnn on NVIDIA GPUs, splash on TPUs)",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps per cell after the compiling one"
    )
    parser.add_argument(
        "--check_batch",
        type=int,
        default=8,
        help="sequences in the backend check's batch (rounded up to the device count)",
    )
    parser.add_argument(
        "--no_check", action="store_true", help="skip the fused-vs-xla check of outputs/gradients"
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        default=390.0,
        help="time budget in seconds; work not expected to finish within it is skipped",
    )
    parser.add_argument(
        "--peak_flops",
        type=float,
        default=0.0,
        help="peak bf16 FLOP/s of one device for MFU (default: bertjax.engine.perf's data-sheet table)",  # noqa: E501
    )
    report.add_json_flag(parser)
    parser.add_argument(
        "--profile",
        default="",
        help="directory: per cell, the train step's optimised HLO (compiled once more to get "
        f"it), a jax.profiler trace of {PROFILED_STEPS} more steps (untimed) and a steady "
        "step's breakdown by kind (printed), in a folder named after the cell",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "check_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    for name in ("warmup", "batch_size"):
        if getattr(args, name) < 0:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 0")
    if args.budget_s <= 0 or args.peak_flops < 0:
        parser.error("--budget_s must be > 0 and --peak_flops >= 0")
    args.tiny = args.tiny or jax.default_backend() == "cpu"
    valid_models = TINY_MODELS if args.tiny else MODELS
    default_models = ",".join(valid_models)
    args.models = tuple(s.strip() for s in (args.models or default_models).split(",") if s.strip())
    for name in args.models:
        if name not in valid_models:
            parser.error(f"--models: {name!r} is not one of {valid_models}")
    if args.seq_lens is not None:  # else each model's DEFAULT_SEQ_LENS
        args.seq_lens = _int_list("--seq_lens", args.seq_lens)
        if min(args.seq_lens) < 16:
            parser.error(f"--seq_lens={args.seq_lens} is invalid: every length must be >= 16")
    return args


def is_modern(model_name: str) -> bool:
    """Whether the model is a ModernBERT (configs/modernbert_*.py)."""
    return model_name.startswith("modernbert")


def seq_lens_for(args: argparse.Namespace, model_name: str) -> tuple[int, ...]:
    return args.seq_lens or DEFAULT_SEQ_LENS[model_name]


def layouts_for(model_name: str) -> tuple[str, ...]:
    """BERT trains on padded sentence pairs; ModernBERT on packed documents, and a padded
    batch is timed beside them (the two take different kernel paths, see the docstring)."""
    return (PADDED, PACKED) if is_modern(model_name) else (PADDED,)


# ----------------------------------------------------------------------------- settings


def load_config(name: str):
    """configs/<name>.py's get_config() (configs/tiny.py and configs/modernbert_tiny.py for the
    tiny models)."""
    return fixtures.recipe(commands.REPO / "configs" / f"{name}.py")


def num_predictions(seq_len: int, model_name: str) -> int:
    """Masked positions per sequence: S * 5 / 32 for BERT (google's 20 at 128, 80 at 512),
    30% of S for ModernBERT (its recipe's rate: 307 at 1,024)."""
    if is_modern(model_name):
        return max(1, round(seq_len * MODERN_MASKING_RATE))
    return max(1, seq_len * 5 // 32)


def default_batch_size(args: argparse.Namespace, seq_len: int) -> int:
    if args.batch_size:
        return args.batch_size
    if args.tiny:
        return 8
    return max(1, TOKENS_PER_BATCH // seq_len)


def round_up_to_devices(n: int) -> int:
    count = jax.device_count()
    return -(-n // count) * count


def training_flops(settings: PretrainSettings, seq_len: int, predictions: int) -> float:
    """Matmul FLOPs to train on one sequence, as the pretraining run counts them for its MFU
    (its objective's count: the family's pair head included, computed even when unused)."""
    return objectives.get(settings.objective).flops(
        encoders.family_of(settings.model),
        settings.model,
        seq_len,
        predictions,
        settings.objective_settings,
    )


def make_settings(
    model_name: str, attention_impl: str, batch_size: int, seq_len: int, dtype: str, seed: int
) -> PretrainSettings:
    """The recipe's settings with this cell's sizes and attention backend."""
    config = load_config(model_name)
    if model_name == TINY_MODEL:
        config.model.update(TINY_OVERRIDES)
        config.model.vocab_size = TINY_VOCAB
    elif model_name == MODERN_TINY:
        config.model.vocab_size = TINY_VOCAB
    else:
        config.model.vocab_size = MODERN_VOCAB if is_modern(model_name) else 30522
    config.model.dtype = dtype
    config.model.attention_impl = attention_impl
    config.model.attention_dropout = 0.0  # the fused kernels cannot drop attention weights
    config.batch_size = batch_size
    config.grad_accum_steps = 1
    config.token_capacity = 1.0
    config.data.max_seq_length = seq_len
    config.data.max_predictions_per_seq = num_predictions(seq_len, model_name)
    # One batch size throughout (ModernBERT's recipe warms it up).
    config.batch_warmup_start = 0
    config.batch_warmup_steps = 0
    config.mesh_shape = (-1, 1, 1)
    config.seed = seed
    return PretrainSettings.from_config(config)


def fused_backend(requested: str) -> tuple[str | None, str]:
    """(the fused backend to run or None, a line saying what was chosen and why)."""
    backend = jax.default_backend()
    kind = jax.devices()[0].device_kind
    nvidia = backend == "gpu" and "cuda" in jax.devices()[0].client.platform_version.lower()
    if requested == "none":
        return None, "fused attention: not requested (--fused none); xla only"
    if requested == "auto":
        if backend == "tpu":
            return "splash", f"fused attention: splash (Pallas TPU kernel) on {kind}"
        if nvidia:
            return "cudnn", f"fused attention: cudnn (cuDNN flash attention) on {kind}"
        return None, (
            f"fused attention: none available on {backend} ({kind}): cuDNN flash attention "
            "needs an NVIDIA GPU and splash a TPU; xla only (--fused splash runs splash in "
            "Pallas interpret mode, for the backend check)"
        )
    if requested == "cudnn" and not nvidia:
        return None, (
            f"fused attention: cudnn unavailable on {backend} ({kind}): it needs an NVIDIA "
            "GPU; xla only"
        )
    if requested == "splash" and backend != "tpu":
        return "splash", (
            f"fused attention: splash in Pallas interpret mode on {backend} ({kind}): "
            "correct but slow, its timings mean nothing"
        )
    return requested, f"fused attention: {requested} on {kind}"


@contextlib.contextmanager
def attention_messages() -> Iterator[list[str]]:
    """Collects what bertjax.nn.attention logs (why a requested kernel falls back to xla)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    logger = logging.getLogger(attention.__name__)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def attention_by_layer_kind(
    model: Any, batch: int, seq_len: int, mesh, documents: bool = False
) -> tuple[dict[str, str], str]:
    """({kind of layer: the backend bertjax.nn.attention will run for it}, what it logged about
    why). BERT's layers are all of one kind; ModernBERT's global and local (sliding-window)
    layers resolve apart, as its encoder asks
    (bertjax.encoders.modernbert.attention.layer_masks), and `documents` (packed rows) is a
    request of its own."""
    windows = {"all": None}
    if isinstance(model, ModernBertConfig):
        windows = {"global": None, "local": model.window}
    with attention_messages() as messages, jax.set_mesh(mesh):
        by_kind = {
            kind: attention.resolve_implementation(
                model.attention_impl,
                dtype=jnp.dtype(model.dtype),
                batch=batch,
                seq_len=seq_len,
                num_heads=model.num_heads,
                head_dim=model.head_dim,
                document_mask=documents,
                local_window=window,
            )
            for kind, window in windows.items()
        }
    return by_kind, "; ".join(messages)


def resolved_attention(
    model: Any, batch: int, seq_len: int, mesh, documents: bool = False
) -> tuple[str, str]:
    """(the backend bertjax.nn.attention will run for these shapes, why if not the requested):
    the requested one when any kind of layer runs it (see attention_by_layer_kind)."""
    by_kind, why = attention_by_layer_kind(model, batch, seq_len, mesh, documents)
    impls = list(by_kind.values())
    return (model.attention_impl if model.attention_impl in impls else impls[0]), why


def other_layers_note(by_kind: dict[str, str], impl: str) -> str:
    """Names the kinds of layer that run something else than `impl` (or "")."""
    return "; ".join(
        f"{kind} layers run {other}" for kind, other in by_kind.items() if other != impl
    )


# ----------------------------------------------------------------------------- batches


def make_batch(
    layout: str, rng: np.random.Generator, batch_size: int, seq_len: int, model_name: str, vocab
) -> dict[str, np.ndarray]:
    """A batch of the layout: whole documents packed end to end, or google's padded pairs
    (90% of rows full, the rest from a quarter of the row; row 0 always short)."""
    predictions = num_predictions(seq_len, model_name)
    if layout == PACKED:
        return fixtures.packed_pretraining_batch(rng, batch_size, seq_len, predictions, vocab)
    shortest = max(predictions + 2, seq_len // 4)
    return fixtures.pretraining_batch(
        rng, batch_size, seq_len, predictions, vocab, shortest=shortest, full_share=0.9
    )


# ----------------------------------------------------------------------------- timing


def initial_state(setup: steps.Steps, seed: int) -> tuple[steps.TrainState, float]:
    """(the train state at step 0, seconds to compile and run its initialisation)."""
    made = []

    def init():
        with jax.set_mesh(setup.mesh):
            made.append(setup.state.init(jax.random.key(seed)))
        return made[0]

    seconds = timing.time_call(init, rounds=1, warmup=0).median
    return made[0], seconds


def time_cell(
    setup: steps.Steps,
    state: steps.TrainState,
    seed: int,
    batches: list[dict[str, np.ndarray]],
    warmup: int,
    num_steps: int,
    profile_dir: str = "",
) -> tuple[float, float]:
    """(compile + first step seconds, seconds per timed step) of the real train step from
    `state` (a copy: the step donates its state). With `profile_dir`, then writes the step's
    optimised HLO there, traces PROFILED_STEPS more steps into it and prints (and writes as
    breakdown.json) a steady step's breakdown by kind."""
    device_batches = [steps.global_batch(b, setup.batch_sharding, 1) for b in batches]
    rng = jax.random.key(seed + 1)
    with jax.set_mesh(setup.mesh):
        state = jax.tree.map(jnp.copy, state)

        def run(count: int, offset: int) -> float:
            nonlocal state
            metrics = None
            for i in range(count):
                batch = device_batches[(offset + i) % len(device_batches)]
                state, metrics = setup.train_step(state, batch, rng)
            loss = float(metrics["train/loss"])  # waits for the device
            if not math.isfinite(loss):
                raise FloatingPointError(f"the train step gave a non-finite loss {loss}")
            return loss

        compile_s = timing.time_call(lambda: run(1, 0), rounds=1, warmup=0).median
        if warmup:
            run(warmup, 1)
        timed = timing.time_call(lambda: run(num_steps, 1 + warmup), rounds=1, warmup=0)
        step_s = timed.median / num_steps
        if profile_dir:
            os.makedirs(profile_dir, exist_ok=True)
            compiled = setup.train_step.lower(state, device_batches[0], rng).compile()
            hlo = compiled.as_text()
            with open(os.path.join(profile_dir, "train_step.hlo.txt"), "w") as f:
                f.write(hlo)
            steady = profile.breakdown(
                profile.record(profile_dir, lambda: run(PROFILED_STEPS, 0)), hlo
            )
            with open(os.path.join(profile_dir, "breakdown.json"), "w") as f:
                json.dump(steady.to_json(), f, indent=1)
            print(f"profile {os.path.basename(profile_dir)}:\n{steady.table()}", flush=True)
    return compile_s, step_s


# ----------------------------------------------------------------------------- check


def _relative_errors(test, reference) -> tuple[float, float]:
    """(largest |test - reference|, ||test - reference|| / ||reference||) in float64."""
    a = np.asarray(test, np.float64)
    b = np.asarray(reference, np.float64)
    diff = a - b
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    norm = float(np.linalg.norm(b))
    rel = float(np.linalg.norm(diff)) / norm if norm > 0 else (0.0 if max_abs == 0 else math.inf)
    return max_abs, rel


def _encoder_output(module, *args, **kwargs):
    """Inside a ModernBERT MaskedLM's apply: its encoder's hidden states [b, s, h]."""
    hidden, _ = module.bert(*args, **kwargs)
    return hidden


def _outputs_and_grads(model, params, batch, mesh) -> dict[str, Any]:
    """The pretraining outputs and the gradient of the loss for one batch (deterministic).

    `model` is an encoder family's pretraining model: BERT's (MLM + NSP, its output holds
    the encoder's) or ModernBERT's (the masked LM alone; its encoder output is read by a
    second call of its encoder)."""
    family = encoders.family_of(model.config)
    objective = MaskedLmLoss(model, sentence_pair=family.sentence_pair_head)
    # Rows of packed documents (ModernBERT's packed layout); absent from padded batches.
    packed = {name: batch[name] for name in ("document_ids", "positions") if name in batch}

    def forward(p):
        out = model.apply(
            {"params": p},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=True,
            **packed,
        )
        sums = losses.loss_sums(out.mlm_logits, out.nsp_logits, batch)
        loss = objective.loss(sums, objective.denominators(batch))
        if hasattr(out, "sequence_output"):
            hidden = out.sequence_output
        else:
            hidden = model.apply(
                {"params": p},
                batch["input_ids"],
                None,
                batch["input_mask"],
                deterministic=True,
                method=_encoder_output,
                **packed,
            )
        # Padded positions' encoder outputs mean nothing; compare real tokens only.
        real = batch["input_mask"][..., None].astype(jnp.float32)  # [b, s, 1]
        outputs = {
            "mlm_logits": out.mlm_logits.astype(jnp.float32),
            "sequence_output": hidden.astype(jnp.float32) * real,  # [b, s, h]
            "loss": loss,
        }
        if out.nsp_logits is not None:
            outputs["nsp_logits"] = out.nsp_logits.astype(jnp.float32)
        return loss, outputs

    with jax.set_mesh(mesh):
        (_, outputs), grads = jax.jit(jax.value_and_grad(forward, has_aux=True))(params)
        outputs, grads = jax.device_get((outputs, grads))
    return {**outputs, "grads": grads}


def _gradient_errors(fused, xla, exact) -> list[tuple[str, float, float, float]]:
    """(quantity, error vs xla, bf16 error vs float32, largest |difference|) for gradients.

    Two views: all gradients as one vector, and the worst leaf. Leaves whose float32
    gradient is essentially zero are left out of the per-leaf view, where any rounding would
    be an infinite relative error: the key projection's bias, for one, gets no gradient in
    exact arithmetic (softmax ignores a shift shared by all of a query's scores).
    """
    f_leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(fused)]
    x_leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(xla)]
    e_leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(exact)]
    flat = [
        np.concatenate([x.ravel() for x in leaves]) for leaves in (f_leaves, x_leaves, e_leaves)
    ]
    max_abs, rel_all = _relative_errors(flat[0], flat[1])
    _, noise_all = _relative_errors(flat[1], flat[2])
    rms_all = float(np.sqrt(np.mean(flat[2] ** 2)))
    kept = [
        (f, x, e)
        for f, x, e in zip(f_leaves, x_leaves, e_leaves)
        if np.sqrt(np.mean(e**2)) > ZERO_GRADIENT_RMS * rms_all
    ]
    rel_leaf = max((_relative_errors(f, x)[1] for f, x, _ in kept), default=0.0)
    noise_leaf = max((_relative_errors(x, e)[1] for _, x, e in kept), default=0.0)
    leaf_label = f"grads, worst of {len(kept)}/{len(f_leaves)} leaves"
    return [
        ("grads, all as one", rel_all, noise_all, max_abs),
        (leaf_label, rel_leaf, noise_leaf, max_abs),
    ]


def check_backends(
    model_name: str, fused: str, seq_len: int, batch_size: int, seed: int, layout: str = PADDED
) -> tuple[list[Check], str]:
    """The fused backend against xla (and bf16 xla against float32 xla) on one batch."""
    settings = make_settings(model_name, "xla", batch_size, seq_len, DTYPE, seed)
    mesh = sharding.make_mesh(settings.run.mesh_shape)
    family = encoders.family_of(settings.model)
    if is_modern(model_name):
        init = family.pretraining_init(settings.model)
    else:
        init = pretraining_init(
            BertForPreTraining(settings.model), seq_len, num_predictions(seq_len, model_name)
        )
    with jax.set_mesh(mesh):
        params = steps.make_state(init, None, mesh).init(jax.random.key(seed)).params
    rng = np.random.default_rng(seed + 7)
    host_batch = make_batch(layout, rng, batch_size, seq_len, model_name, settings.model.vocab_size)
    batch = steps.global_batch(host_batch, sharding.batch_sharding(mesh), 1)

    def model(impl: str, dtype: str):
        return family.pretraining_model(
            dataclasses.replace(settings.model, attention_impl=impl, dtype=dtype)
        )

    by_kind, why = attention_by_layer_kind(
        model(fused, DTYPE).config, batch_size, seq_len, mesh, documents=layout == PACKED
    )
    if fused not in by_kind.values():
        impl = next(iter(by_kind.values()))
        return [], f"{fused} would fall back to {impl} at these shapes ({why}); not checked"
    xla = _outputs_and_grads(model("xla", DTYPE), params, batch, mesh)
    fused_out = _outputs_and_grads(model(fused, DTYPE), params, batch, mesh)
    with jax.default_matmul_precision("highest"):
        exact = _outputs_and_grads(model("xla", "float32"), params, batch, mesh)

    checks = []
    for quantity in ("mlm_logits", "nsp_logits", "sequence_output", "loss"):
        if quantity not in xla:  # a model without a sentence-pair head
            continue
        max_abs, rel = _relative_errors(fused_out[quantity], xla[quantity])
        _, noise = _relative_errors(xla[quantity], exact[quantity])
        tolerance = max(OUTPUT_TOLERANCE, NOISE_FACTOR * noise)
        checks.append(Check(model_name, seq_len, quantity, max_abs, rel, noise, tolerance, layout))
    for quantity, rel, noise, max_abs in _gradient_errors(
        fused_out["grads"], xla["grads"], exact["grads"]
    ):
        tolerance = max(GRADIENT_TOLERANCE, NOISE_FACTOR * noise)
        checks.append(Check(model_name, seq_len, quantity, max_abs, rel, noise, tolerance, layout))
    # Which kinds of layer the fused backend served (ModernBERT's may be only some).
    return checks, other_layers_note(by_kind, fused)


# ----------------------------------------------------------------------------- report


def format_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A plain-text table, columns as wide as their widest cell."""
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)
    ]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


class Budget:
    """Wall-clock budget: a piece of work runs only if it is expected to finish within it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.elapsed = timing.stopwatch()
        self.estimates: dict[str, float] = {}

    def allows(self, kind: str) -> bool:
        # The last piece of the same kind, with a margin: later cells are the larger ones.
        return self.elapsed() + 1.5 * self.estimates.get(kind, 0.0) <= self.seconds

    def record(self, kind: str, seconds: float) -> None:
        self.estimates[kind] = seconds


def workload_name(model_name: str, layout: str) -> str:
    """The model, and the layout where the model is timed on more than one."""
    return model_name if len(layouts_for(model_name)) == 1 else f"{model_name} ({layout})"


def run_check(
    model_name: str,
    layout: str,
    fused: str,
    args: argparse.Namespace,
    budget: Budget,
    notes: list[str],
) -> list[Check]:
    """The backend check of one model and layout at the longest sequence, if the budget
    allows it."""
    check_seq = max(seq_lens_for(args, model_name))
    name = workload_name(model_name, layout)
    if not budget.allows("check"):
        notes.append(f"check {name}: skipped, over the {args.budget_s:g} s budget")
        return []
    elapsed = timing.stopwatch()
    try:
        checks, why = check_backends(
            model_name,
            fused,
            check_seq,
            round_up_to_devices(args.check_batch),
            args.seed,
            layout,
        )
    except Exception as e:  # a kernel that does not compile here: say so, go on
        checks, why = [], f"failed: {type(e).__name__}: {str(e).splitlines()[0]}"
    budget.record("check", elapsed())
    if why:
        notes.append(f"check {name} seq {check_seq}: {why}")
    for c in checks:
        print("check " + " ".join(c.row()), flush=True)
    return checks


def run_cells(
    model_name: str,
    seq_len: int,
    layout: str,
    backends: tuple[str, ...],
    args: argparse.Namespace,
    budget: Budget,
    total_peak: float | None,
) -> list[Cell]:
    """One cell per backend for a model, sequence length and layout, on the same batches."""
    batch_size = round_up_to_devices(default_batch_size(args, seq_len))
    rng = np.random.default_rng(args.seed + seq_len)
    predictions = num_predictions(seq_len, model_name)
    batches = None
    # One initial state for every backend (their parameters and optimizer state are the
    # same), its initialisation compiled once: for BERT-base's twelve unscanned layers that
    # program is five times BERT-large's scanned one (38,633 against 7,404 HLO lines).
    state = None
    cells = []
    for impl in backends:
        settings = make_settings(model_name, impl, batch_size, seq_len, DTYPE, args.seed)
        model = settings.model
        flops = training_flops(settings, seq_len, predictions)
        base = Cell(
            model_name,
            seq_len,
            batch_size,
            impl,
            layout,
            flops_per_sequence=flops,
            peak_flops=total_peak,
        )
        if not budget.allows("cell"):
            cells.append(dataclasses.replace(base, note="skipped: over the time budget"))
            continue
        setup = build_pretraining(settings, model)
        by_kind, why = attention_by_layer_kind(
            model, batch_size, seq_len, setup.mesh, documents=layout == PACKED
        )
        if impl not in by_kind.values():
            resolved = next(iter(by_kind.values()))
            note = f"falls back to {resolved}: {why}" if why else f"runs {resolved}"
            cells.append(dataclasses.replace(base, note=note))
            continue
        if batches is None:
            batches = [
                make_batch(layout, rng, batch_size, seq_len, model_name, model.vocab_size)
                for _ in range(2)
            ]
        elapsed = timing.stopwatch()
        try:
            init_s = None
            if state is None:
                state, init_s = initial_state(setup, args.seed)
            profile_dir = (
                os.path.join(args.profile, f"{model_name}-{seq_len}-{layout}-{impl}")
                if args.profile
                else ""
            )
            compile_s, step_s = time_cell(
                setup, state, args.seed, batches, args.warmup, args.steps, profile_dir
            )
            cell = dataclasses.replace(
                base,
                init_s=init_s,
                compile_s=compile_s,
                step_s=step_s,
                note=other_layers_note(by_kind, impl),
            )
        except Exception as e:  # e.g. out of memory, or a kernel this device lacks
            first = str(e).splitlines()[0] if str(e) else ""
            cell = dataclasses.replace(base, note=f"failed: {type(e).__name__}: {first}")
        budget.record("cell", elapsed())
        cells.append(cell)
        print("cell " + " ".join(v for v in cell.row() if v), flush=True)
        del setup
        gc.collect()
    return cells


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, prints its tables and returns (and optionally writes) the results."""
    args = parse_args(argv)
    machine = report.start("accelerator", argv)
    budget = Budget(args.budget_s)
    device = jax.devices()[0]
    fused, fused_line = fused_backend(args.fused)
    peak = perf.peak_flops_per_device(device.device_kind, DTYPE, args.peak_flops or None)
    total_peak = peak * jax.device_count() if peak else None
    print(
        "peak bf16 FLOP/s per device: "
        + (
            f"{peak / 1e12:.0f} T ({'--peak_flops' if args.peak_flops else 'data sheet'})"
            if peak
            else f"unknown for {device.device_kind!r}: MFU n/a (give --peak_flops)"
        )
    )
    print(fused_line)
    lengths = ", ".join(
        f"{name} {','.join(map(str, seq_lens_for(args, name)))}" for name in args.models
    )
    print(
        f"models and sequence lengths: {lengths}; {DTYPE} compute; "
        f"{args.warmup} warm-up + {args.steps} timed steps per cell; budget {args.budget_s:g} s",
        flush=True,
    )
    backends = ("xla",) + ((fused,) if fused else ())
    cells: list[Cell] = []
    checks: list[Check] = []
    notes: list[str] = []

    for model_name in args.models:
        for layout in layouts_for(model_name):
            if fused and not args.no_check:
                checks += run_check(model_name, layout, fused, args, budget, notes)
            for seq_len in seq_lens_for(args, model_name):
                cells += run_cells(model_name, seq_len, layout, backends, args, budget, total_peak)

    if not fused:
        notes.append("backend comparison: not run, no fused backend (see 'fused attention' above)")
    print()
    print(format_table(COLUMNS, [c.row() for c in cells]))
    print()
    if checks:
        print(
            "fused vs xla on one batch: relative L2 error; bf16 err: xla bf16 vs float32; "
            f"tolerance max({OUTPUT_TOLERANCE:g} outputs / {GRADIENT_TOLERANCE:g} gradients, "
            f"{NOISE_FACTOR:g} x bf16's own error against float32)"
        )
        print(format_table(CHECK_COLUMNS, [c.row() for c in checks]))
        print()
        print(f"backend check: {'PASS' if all(c.passed for c in checks) else 'FAIL'}")
    for note in notes:
        print(f"note: {note}")
    print(f"total {budget.elapsed():.0f} s")

    result = {
        "peak_flops_per_device": peak,
        "fused": fused,
        "fused_note": fused_line,
        "cells": [c.to_json() for c in cells],
        "checks": [c.to_json() for c in checks],
        "check_passed": all(c.passed for c in checks) if checks else None,
        "notes": notes,
        "elapsed_s": budget.elapsed(),
    }
    report.finish("accelerator", args, result, machine)
    return result


if __name__ == "__main__":
    main()
