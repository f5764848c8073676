"""Question-answering throughput: bertjax's QA training and prediction beside transformers'
BertForQuestionAnswering, on the same model and the same windows.

    python benchmarks/qa.py                       # BERT-small (L4/H512/A8), B32, S384
    python benchmarks/qa.py --preset base --windows 512 --dtype bfloat16   # accelerators

Windows are SQuAD-shaped ([CLS] question [SEP] context [SEP], run_squad.py's
max_seq_length 384): random ids, a question of --question_lengths pieces and a context of
--context_lengths pieces (the default, 100 to 250, is about SQuAD v1.1's paragraphs), an
answer span of 1 to 5 tokens inside the context. Training runs as finetune.py runs a
question_answering epoch (the task's objective built by build_finetuning, host batches from
the epoch's permutation, the jitted donated step with google's AdamW recipe), padded to
max_seq_length and with finetune.py's defaults (its widths, multiples of 32, and token packing).
transformers trains with torch's AdamW and linear schedule, on the padded batches and on
batches padded to their longest window. Prediction: the windows' start and end logits,
bertjax as the fine-tuning loop evaluates (finetune.evaluation.run_eval), transformers in
torch.no_grad on the same padded batches.

Steady state: compilation and torch's first steps are excluded: bertjax compiles its step
and evaluation at every width a run can meet (each length bucket) before timing, as a long
run would have after its first steps, and every side runs one untimed epoch and prediction
pass. Rounds run every side once; ratios are taken within each round and their median printed.

The whole command (a user's clock, skipped with --no_whole_command): `python finetune.py
--config.task=question_answering` for one epoch on the same windows (written as a SQuAD JSON
file: the --squad file's first --windows questions, or synthetic paragraphs of the same
lengths, and a quarter as many questions to evaluate), timed from its start to its exit
(start-up, reading, compiling, training, evaluation with decoding and F1, predictions and
checkpoints), twice: with an empty compilation cache, then with the cache the first run
filled (bertjax.engine.compilation_cache). Beside it the same as a torch user's script does it:
transformers' tokenizer windows the file (as run_qa.py), BertForQuestionAnswering trains one
epoch by the grouped loop below and predicts every evaluation window's logits, timed from
the script's start to its exit, its dev F1 decoded as run_qa.py's post-processing does (no
checkpoint: in torch's favour).

`--compile_ahead_rounds N` times only the whole command, with an empty compilation cache each
time, with `config.compile_ahead=0` and `=1` alternately for N rounds, and prints each round's
ratio (bertjax.engine.compile_ahead: the run's programs compiled in a background thread).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from benchmarks.finetune import _no_decay, versions  # noqa: E402
from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.encoders.bert import hf as bert_hf  # noqa: E402
from bertjax.encoders.bert.config import PRESETS, BertConfig  # noqa: E402
from bertjax.encoders.bert.model import BertForPreTraining  # noqa: E402
from bertjax.engine import (  # noqa: E402
    optim,  # noqa: E402
    perf,  # noqa: E402
    steps,  # noqa: E402
)
from bertjax.finetune import batches as batches_lib  # noqa: E402
from bertjax.finetune import evaluation, warm_start  # noqa: E402
from bertjax.finetune import widths as widths_lib  # noqa: E402
from bertjax.finetune.objective import build_finetuning  # noqa: E402
from bertjax.finetune.task import Examples  # noqa: E402
from bertjax.tasks.qa import metrics as qa_metrics  # noqa: E402
from bertjax.tasks.qa import model as qa_model  # noqa: E402
from bertjax.tasks.qa import squad  # noqa: E402
from bertjax.tasks.qa import task as qa_task  # noqa: E402
from bertjax.text.tokenizer import WordPieceTokenizer  # noqa: E402

try:  # the reference is optional: torch and transformers live in the `hf` extra
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    transformers = None

FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK]
CLS_ID, SEP_ID = 2, 3
HEAD = HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS)


def _pair(text: str, name: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        parser.error(f"--{name}={text!r} is invalid: give min,max like 100,250")
    if not 1 <= low <= high:
        parser.error(f"--{name}={text!r} is invalid: need 1 <= min <= max")
    return low, high


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument(
        "--windows", type=int, default=64, help="training windows per epoch (--squad: at most)"
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=384)
    parser.add_argument("--question_lengths", default="6,20")
    parser.add_argument("--context_lengths", default="100,250")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--matmul_dtype",
        default=None,
        choices=("float32", "bfloat16"),
        help="bertjax's products' operand dtype (model.matmul_dtype; default: --dtype)",
    )
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--rounds", type=int, default=2, help="timed passes per side")
    parser.add_argument("--no_reference", action="store_true", help="skip transformers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--squad",
        default="",
        help="a SQuAD JSON file: train on its real windows (run_squad's doc_stride 128) "
        "instead of synthetic ones; needs --init_from for the vocabulary",
    )
    parser.add_argument(
        "--init_from",
        default="",
        help="a Hugging Face BERT directory (e.g. a MiniLM): its architecture, weights and "
        "vocabulary on both sides (overrides --preset and --vocab_size)",
    )
    parser.add_argument(
        "--micro_batches",
        type=int,
        default=4,
        help="micro-batches grouped by length per batch (both sides' length-grouped runs)",
    )
    parser.add_argument(
        "--no_whole_command",
        action="store_true",
        help="skip timing the whole finetune.py command (and the torch script beside it)",
    )
    parser.add_argument(
        "--only_whole_command",
        action="store_true",
        help="time the whole finetune.py command (and the torch script) alone",
    )
    parser.add_argument(
        "--compile_ahead_rounds",
        type=int,
        default=0,
        help="time the whole finetune.py command alone, with an empty compilation cache each "
        "time, with config.compile_ahead=0 and =1 alternately for this many rounds",
    )
    parser.add_argument(
        "--torch_command",
        default="",
        help=argparse.SUPPRESS,  # internal: the torch user's script, run in its own process
    )
    parser.add_argument(
        "--torch_head_init",
        default="transformers",
        choices=("transformers", "google"),
        help="the torch side's fresh QA head: transformers' normal of 0.02, or google's (and "
        "bertjax's) normal of 0.02 truncated at two deviations",
    )
    parser.add_argument(
        "--grouped_only",
        action="store_true",
        help="only the length-grouped sides (bertjax and transformers): one bertjax side's "
        "programs instead of three, and a third of the time",
    )
    args = parser.parse_args(argv)
    if args.squad and not args.init_from:
        parser.error("--squad needs --init_from (the vocabulary that cuts the windows)")
    if args.micro_batches < 1 or args.batch_size % args.micro_batches:
        parser.error(f"--micro_batches={args.micro_batches} must divide --batch_size")
    for name in ("windows", "batch_size", "max_seq_length", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    if args.windows < args.batch_size:
        parser.error(f"--windows={args.windows} must be at least --batch_size={args.batch_size}")
    args.question_lengths = _pair(args.question_lengths, "question_lengths", parser)
    args.context_lengths = _pair(args.context_lengths, "context_lengths", parser)
    if args.question_lengths[1] + args.context_lengths[1] + 3 > args.max_seq_length:
        parser.error("the longest question and context must fit in --max_seq_length with 3 more")
    return args


def synthetic_windows(args: argparse.Namespace) -> Examples:
    """SQuAD-shaped windows of random ids with an answer span in each context."""
    rng = np.random.default_rng(args.seed)
    n, length = args.windows, args.max_seq_length
    features = {
        name: np.zeros((n, length), np.int32) for name in ("input_ids", "input_mask", "segment_ids")
    }
    starts, ends = np.zeros(n, np.int32), np.zeros(n, np.int32)
    for row in range(n):
        q = int(rng.integers(args.question_lengths[0], args.question_lengths[1] + 1))
        c = int(rng.integers(args.context_lengths[0], args.context_lengths[1] + 1))
        ids = [CLS_ID, *rng.integers(FIRST_REAL_ID, args.vocab_size, q), SEP_ID]
        context_start = len(ids)
        ids += [*rng.integers(FIRST_REAL_ID, args.vocab_size, c), SEP_ID]
        features["input_ids"][row, : len(ids)] = ids
        features["input_mask"][row, : len(ids)] = 1
        features["segment_ids"][row, context_start : len(ids)] = 1
        starts[row] = context_start + int(rng.integers(0, c - 4 if c > 5 else 1))
        ends[row] = min(starts[row] + int(rng.integers(0, 5)), context_start + c - 1)
    features["start_positions"], features["end_positions"] = starts, ends
    return Examples("train", "synthetic", features, [str(i) for i in range(n)], True)


def real_windows(args: argparse.Namespace, tokenizer) -> Examples:
    """The training windows finetune.py cuts from a SQuAD file (max_seq_length, stride 128)."""
    settings = squad.QASettings(max_seq_length=args.max_seq_length)
    windows, _ = qa_task.encode_split("train", args.squad, tokenizer, settings, training=True)
    count = min(args.windows, len(windows))  # the file's first windows, in order
    features = {name: array[:count] for name, array in windows.features.items()}
    return Examples("train", args.squad, features, [str(i) for i in range(count)], True)


def model_config(args: argparse.Namespace, source) -> BertConfig:
    if source is not None:
        return dataclasses.replace(source.config, dtype=args.dtype, matmul_dtype=args.matmul_dtype)
    return BertConfig.preset(
        args.preset, vocab_size=args.vocab_size, dtype=args.dtype, matmul_dtype=args.matmul_dtype
    )


class Bertjax:
    """A question_answering epoch as finetune.py runs it, and the loop's evaluation.

    `micro_batches` > 1: each batch as length-grouped micro-batches (group_by_length);
    otherwise one batch cut to `length_bucket`, token-packed to `token_capacity`.
    """

    def __init__(
        self,
        args,
        windows,
        optimizer,
        token_capacity: float,
        length_bucket: int,
        micro_batches: int = 1,
        source=None,
    ):
        self.windows, self.batch_size, self.length_bucket = windows, args.batch_size, length_bucket
        self.micro_batches = micro_batches
        # finetune.py's widths for these epochs (its first, untimed, and the rounds).
        self.train_widths = widths_lib.training_widths(
            windows, (0,), args.rounds + 1, args.batch_size, micro_batches, length_bucket
        )
        self.eval_widths = widths_lib.evaluation_widths([windows], 32)
        self.ft = build_finetuning(
            model_config(args, source),
            HEAD,
            optimizer,
            mesh_shape=(-1, 1, 1),
            grad_accum_steps=micro_batches,
            micro_batch_size=args.batch_size // micro_batches,
            max_seq_length=args.max_seq_length,
            token_capacity=token_capacity,
        )
        with jax.set_mesh(self.ft.mesh):
            self.state = self.ft.state.init(jax.random.key(args.seed))
            if source is not None:  # the encoder's real weights, a fresh qa_outputs head
                params, _, _ = warm_start.initial_params(source, self.ft, self.state.params)
                self.state = self.state.replace(params=params)
        self.rng = jax.random.key(args.seed + 1)
        self.epoch = 0

    def compile_widths(self) -> None:
        """Compiles the train step and the evaluation at every width the run meets (its
        training_widths and evaluation_widths, as finetune.py's).

        A run meets each width once and keeps its program, so a long run's steady state pays no
        compilation; an epoch of a few steps would meet new widths in the timed rounds. The
        steps run on a throwaway state.
        """
        features = self.windows.features
        seq = features["input_mask"].shape[1]
        rows = self.batch_size // self.micro_batches
        with jax.set_mesh(self.ft.mesh):
            state = self.ft.state.init(jax.random.key(0))
            for width in self.train_widths or (seq,):
                micro = {
                    k: v[:rows, :width] if v.ndim == 2 else v[:rows] for k, v in features.items()
                }
                micro["weights"] = np.ones(rows, np.float32)
                batch = [micro] * self.micro_batches if self.micro_batches > 1 else micro
                state, metrics = self.ft.steps.take_step(state, batch, self.rng)
            jax.block_until_ready(metrics)
            for width in self.eval_widths:  # run_eval's widths and rows per call
                rows = perf.rows_per_call(width, self.batch_size)
                batch = {
                    k: v[:rows, :width] if v.ndim == 2 else v[:rows] for k, v in features.items()
                }
                batch["weights"] = np.ones(rows, np.float32)
                global_batch = steps.global_batch(batch, self.ft.batch_sharding, 1)
                jax.block_until_ready(self.ft.eval_step(state.params, global_batch))

    def run_epoch(self) -> float:
        order = batches_lib.epoch_order(0, self.epoch, len(self.windows))
        metrics = None
        with jax.set_mesh(self.ft.mesh):
            for index in range(len(self.windows) // self.batch_size):
                if self.micro_batches > 1:
                    local = batches_lib.train_micro_batches(
                        self.windows,
                        order,
                        index,
                        self.batch_size,
                        self.micro_batches,
                        self.length_bucket,
                        self.train_widths,
                    )
                else:
                    local = batches_lib.train_batch(
                        self.windows,
                        order,
                        index,
                        self.batch_size,
                        self.length_bucket,
                        self.train_widths,
                    )
                self.state, metrics = self.ft.steps.take_step(self.state, local, self.rng)
        self.epoch += 1
        return float(metrics["train/loss"])  # waits for the device

    def predict(self) -> np.ndarray:
        """The loop's evaluation: windows grouped by length, cut to finetune.py's widths."""
        with jax.set_mesh(self.ft.mesh):
            _, outputs = evaluation.run_eval(
                self.ft, self.state.params, self.windows, self.batch_size, 32, self.eval_widths
            )
        return outputs["start_logits"]


class Transformers:
    """transformers' BertForQuestionAnswering with torch's AdamW and linear schedule."""

    # padded: every batch at max_seq_length; dynamic: each batch padded to its longest, in
    # the epoch's order; grouped: each batch sorted by length and run as micro_batches slices,
    # each padded to its longest, gradients summed (the same update as one batch).
    MODES = ("padded", "dynamic", "grouped")

    def __init__(self, args, windows, optimizer: optim.OptimizerSettings, mode: str):
        torch.manual_seed(args.seed)
        torch.set_num_threads(os.cpu_count() or 1)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if args.init_from:
            model = transformers.BertForQuestionAnswering.from_pretrained(args.init_from)
        else:
            config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
            hf_config = transformers.BertConfig(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                num_hidden_layers=config.num_layers,
                num_attention_heads=config.num_heads,
                intermediate_size=config.intermediate_size,
                max_position_embeddings=max(512, args.max_seq_length),
            )
            model = transformers.BertForQuestionAnswering(hf_config)
        if args.torch_head_init == "google":  # as bertjax starts a fresh head
            with torch.no_grad():
                torch.nn.init.trunc_normal_(model.qa_outputs.weight, std=0.02, a=-0.04, b=0.04)
                model.qa_outputs.bias.zero_()
        self.model = model.to(self.device)
        self.mode, self.micro_batches = mode, args.micro_batches
        decay = [p for n, p in self.model.named_parameters() if not _no_decay(n)]
        rest = [p for n, p in self.model.named_parameters() if _no_decay(n)]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": optimizer.weight_decay},
                {"params": rest, "weight_decay": 0.0},
            ],
            lr=optimizer.learning_rate,
            betas=(optimizer.b1, optimizer.b2),
            eps=optimizer.eps,
        )
        self.schedule = transformers.get_linear_schedule_with_warmup(
            self.optimizer, optimizer.warmup_steps, optimizer.total_steps
        )
        self.autocast = torch.bfloat16 if args.dtype == "bfloat16" else None
        self.windows, self.batch_size = windows, args.batch_size
        self.epoch = 0

    def _batch(self, rows: np.ndarray, dynamic: bool) -> dict:
        features = self.windows.features
        width = int(features["input_mask"][rows].sum(axis=1).max()) if dynamic else None
        batch = {
            name: torch.from_numpy(features[key][rows][:, :width].astype(np.int64))
            for name, key in (
                ("input_ids", "input_ids"),
                ("attention_mask", "input_mask"),
                ("token_type_ids", "segment_ids"),
            )
        }
        return {name: tensor.to(self.device) for name, tensor in batch.items()}

    def _slices(self, rows: np.ndarray) -> list[np.ndarray]:
        if self.mode != "grouped":
            return [rows]
        lengths = self.windows.features["input_mask"][rows].sum(axis=1)
        return np.array_split(rows[np.argsort(lengths, kind="stable")], self.micro_batches)

    def run_epoch(self) -> float:
        self.model.train()
        order = batches_lib.epoch_order(0, self.epoch, len(self.windows))
        loss = None
        for index in range(len(self.windows) // self.batch_size):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            self.optimizer.zero_grad(set_to_none=True)
            for part in self._slices(rows):
                batch = self._batch(part, self.mode != "padded")
                for name in ("start_positions", "end_positions"):
                    positions = self.windows.features[name][part].astype(np.int64)
                    batch[name] = torch.from_numpy(positions).to(self.device)
                with torch.autocast(
                    self.device.type, dtype=self.autocast, enabled=bool(self.autocast)
                ):
                    # The slice's mean loss, weighted to its share of the batch.
                    loss = self.model(**batch).loss * (len(part) / len(rows))
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.schedule.step()
        self.epoch += 1
        return float(loss.detach())

    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """No-grad forward passes; grouped: the windows sorted by length first. The start and
        end logits [windows, max_seq_length] in the windows' order (-inf past a batch's width)."""
        self.model.eval()
        shape = self.windows.features["input_ids"].shape
        starts, ends = np.full(shape, -np.inf, np.float32), np.full(shape, -np.inf, np.float32)
        order = np.arange(len(self.windows))
        if self.mode == "grouped":
            lengths = self.windows.features["input_mask"].sum(axis=1)
            order = np.argsort(lengths, kind="stable")
        with torch.no_grad():
            for first in range(0, len(self.windows), self.batch_size):
                rows = order[first : first + self.batch_size]
                with torch.autocast(
                    self.device.type, dtype=self.autocast, enabled=bool(self.autocast)
                ):
                    out = self.model(**self._batch(rows, self.mode != "padded"))
                width = out.start_logits.shape[1]
                starts[rows, :width] = out.start_logits.float().cpu().numpy()
                ends[rows, :width] = out.end_logits.float().cpu().numpy()
        return starts, ends


# ----------------------------------------------------------------------------- the whole command

# finetune.py's summary line (bertjax.finetune.summary.print_summary).
SUMMARY = re.compile(
    r"wall time: ([\d.]+) s, of which compiling ([\d.]+) s \(\d+ %, (\d+) programs compiled, "
    r"(\d+) loaded"
)


def _squad_file(path: str, questions: list[tuple[str, str, str, str, int]]) -> None:
    """Writes (id, question, context, answer text, answer start) rows as a SQuAD v1.1 file,
    one paragraph per question."""
    paragraphs = [
        {
            "context": context,
            "qas": [{"id": qid, "question": q, "answers": [{"text": t, "answer_start": a}]}],
        }
        for qid, q, context, t, a in questions
    ]
    data = {"version": "1.1", "data": [{"title": "benchmark", "paragraphs": paragraphs}]}
    with open(path, "w") as f:
        json.dump(data, f)


def _real_questions(path: str, count: int) -> list[tuple[str, str, str, str, int]]:
    """A SQuAD file's first `count` answerable questions, in order."""
    with open(path) as f:
        data = json.load(f)
    out = []
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if qa.get("answers") and len(out) < count:
                    answer = qa["answers"][0]
                    out.append(
                        (
                            qa["id"],
                            qa["question"],
                            paragraph["context"],
                            answer["text"],
                            answer["answer_start"],
                        )
                    )
    return out


def _synthetic_questions(args, words: list[str], count: int, rng) -> list[tuple]:
    """Questions and paragraphs of words that are one token each, of the benchmark's lengths,
    the answer 1 to 5 words of the paragraph."""
    out = []
    for k in range(count):
        q = int(rng.integers(args.question_lengths[0], args.question_lengths[1] + 1))
        c = int(rng.integers(args.context_lengths[0], args.context_lengths[1] + 1))
        context_words = list(rng.choice(words, c))
        first = int(rng.integers(0, max(1, c - 5)))
        answer_words = context_words[first : first + int(rng.integers(1, 6))]
        start = len(" ".join(context_words[:first])) + (1 if first else 0)
        out.append(
            (
                f"q{k}",
                " ".join(rng.choice(words, q)),
                " ".join(context_words),
                " ".join(answer_words),
                start,
            )
        )
    return out


def command_inputs(args, directory: str) -> tuple[str, str, str]:
    """(init_from, training file, evaluation file) of the whole command, written in
    `directory`: the --init_from model or a randomly initialised --preset one with a vocabulary
    of one-token words, and SQuAD files of --windows questions and a quarter as many."""
    rng = np.random.default_rng(args.seed)
    count, held_out = args.windows, max(args.batch_size, args.windows // 4)
    init_from = args.init_from
    if not init_from:
        init_from = os.path.join(directory, "model")
        vocab = os.path.join(directory, "vocab.txt")
        words = [f"w{i}" for i in range(FIRST_REAL_ID, args.vocab_size)]
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
        params = BertForPreTraining(config).init(
            jax.random.key(args.seed), np.zeros((1, 8), np.int32)
        )
        bert_hf.save(config, params, init_from, WordPieceTokenizer.from_vocab(vocab))
    else:
        with open(os.path.join(init_from, "vocab.txt")) as f:
            words = [w for w in f.read().split() if w.isalpha() and w.islower()]
    if args.squad:
        questions = _real_questions(args.squad, count + held_out)
    else:
        questions = _synthetic_questions(args, words, count + held_out, rng)
    train, dev = os.path.join(directory, "train.json"), os.path.join(directory, "dev.json")
    _squad_file(train, questions[:count])
    _squad_file(dev, questions[count:])
    return init_from, train, dev


def _run(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """(seconds from start to exit, stdout) of a command that must succeed."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def _finetune_command(args, directory: str, name: str, cache: str, inputs) -> list[str]:
    """finetune.py's command line for one epoch of the benchmark's windows."""
    init_from, train, dev = inputs
    return [
        sys.executable,
        os.path.join(_REPO, "finetune.py"),
        f"--workdir={os.path.join(directory, name.split(',')[0].replace(' ', '_'))}",
        f"--compilation_cache={cache}",
        "--config.task=question_answering",
        f"--config.init_from={init_from}",
        f"--config.data.train={train}",
        f"--config.data.validation={dev}",
        "--config.num_epochs=1",
        f"--config.batch_size={args.batch_size}",
        f"--config.eval_batch_size={args.batch_size}",
        f"--config.grad_accum_steps={args.micro_batches}",
        f"--config.data.max_seq_length={args.max_seq_length}",
        f"--config.model.dtype={args.dtype}",
        *([f"--config.model.matmul_dtype={args.matmul_dtype}"] if args.matmul_dtype else []),
    ]


def compile_ahead_rounds(args) -> dict[str, float]:
    """Times finetune.py's whole command with config.compile_ahead=0 and =1 alternately (the
    first of each round alternating too), each run with an empty compilation cache of its own;
    prints each round's ratio and their median."""
    with tempfile.TemporaryDirectory(prefix="bertjax-qa-") as directory:
        inputs = command_inputs(args, directory)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
        print(f"\nwhole command, compiled ahead or not: 1 epoch of {inputs[1]}, empty caches")
        times: dict[int, list[float]] = {0: [], 1: []}
        for round_ in range(args.compile_ahead_rounds):
            # Which goes first alternates: a busy host's load drifts within a round.
            for threads in (0, 1) if round_ % 2 == 0 else (1, 0):
                name = f"ahead {threads} round {round_}"
                cache = os.path.join(directory, f"xla {name}")
                command = _finetune_command(args, directory, name, cache, inputs)
                seconds, out = _run([*command, f"--config.compile_ahead={threads}"], env)
                found = SUMMARY.search(out)
                f1 = re.findall(r"eval/f1 ([\d.]+)", out)
                print(
                    f"  compile_ahead={threads}, round {round_}: {seconds:.1f} s"
                    + (f" (compiling {found[2]} s, {found[3]} programs)" if found else "")
                    + (f", eval/f1 {f1[-1]}" if f1 else ""),
                    flush=True,
                )
                times[threads].append(seconds)
            print(f"    round {round_}: off / on {times[0][-1] / times[1][-1]:.2f}x", flush=True)
        ratio = statistics.median(a / b for a, b in zip(times[0], times[1]))
        print(f"  compile_ahead=1 over 0, median of rounds: {ratio:.2f}x (above 1: faster)")
    return {"command compile_ahead 0": statistics.median(times[0]), "ratio": ratio}


def whole_command(args) -> dict[str, float]:
    """Times finetune.py's whole command cold and warm, and the torch script; prints them."""
    with tempfile.TemporaryDirectory(prefix="bertjax-qa-") as directory:
        inputs = command_inputs(args, directory)
        init_from, train, dev = inputs
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
        cache = os.path.join(directory, "xla")
        result = {}
        print(f"\nwhole command: 1 epoch of {train} (evaluated on {dev}), process start to exit")
        for name in ("empty compilation cache", "second run, cache warm"):
            command = _finetune_command(args, directory, name, cache, inputs)
            seconds, out = _run(command, env)
            found = SUMMARY.search(out)
            inside, compiling, compiled, loaded = (
                (float(found[1]), float(found[2]), int(found[3]), int(found[4]))
                if found
                else (float("nan"), float("nan"), -1, -1)
            )
            f1 = re.findall(r"eval/f1 ([\d.]+)", out)
            print(
                f"  bertjax finetune.py, {name}: {seconds:.1f} s (inside the run {inside:.1f} s, "
                f"compiling {compiling:.1f} s: {compiled} programs compiled, {loaded} loaded"
                + (f"; eval/f1 {f1[-1]}" if f1 else "")
                + ")"
            )
            result[f"command bertjax {name}"] = seconds
            if f1:
                result["dev F1 bertjax"] = float(f1[-1])
        if not args.no_reference and torch is not None:
            torch_args = [
                sys.executable,
                os.path.abspath(__file__),
                f"--torch_command={directory}",
                f"--init_from={init_from}",
                f"--batch_size={args.batch_size}",
                f"--max_seq_length={args.max_seq_length}",
                f"--micro_batches={args.micro_batches}",
                f"--dtype={args.dtype}",
                f"--seed={args.seed}",
                f"--torch_head_init={args.torch_head_init}",
                "--question_lengths={},{}".format(*args.question_lengths),
                "--context_lengths={},{}".format(*args.context_lengths),
            ]
            seconds, out = _run(torch_args, env)
            print(f"  transformers grouped torch loop: {seconds:.1f} s ({out.strip()})")
            result["command transformers grouped"] = seconds
            torch_f1 = re.findall(r"dev F1 ([\d.]+)", out)
            if torch_f1 and "dev F1 bertjax" in result:
                result["dev F1 transformers"] = float(torch_f1[-1])
                difference = result["dev F1 bertjax"] - result["dev F1 transformers"]
                print(f"  dev F1, bertjax - transformers: {difference:+.4f} (F1 in 0-100)")
            torch_loss = re.findall(r"dev loss ([\d.]+)", out)
            if torch_loss:
                print(f"  transformers dev loss (over real positions): {torch_loss[-1]}")
            for name in ("empty compilation cache", "second run, cache warm"):
                ratio = seconds / result[f"command bertjax {name}"]
                print(f"  bertjax ({name}) / transformers: {ratio:.2f}x")
    return result


def _hf_read(tokenizer, path: str, max_seq_length: int) -> tuple[list[tuple], Any]:
    """A SQuAD file's (id, question, context, answer text, answer start) rows and their
    windows as transformers' tokenizer cuts them for run_qa.py (the context truncated into
    windows overlapping by 128 tokens; offsets and each window's source question kept)."""
    questions = _real_questions(path, 10**9)
    encoded = tokenizer(
        [q for _, q, _, _, _ in questions],
        [c for _, _, c, _, _ in questions],
        truncation="only_second",
        max_length=max_seq_length,
        # run_qa.py's doc_stride of 128 tokens of overlap (at most a quarter of short windows).
        stride=min(128, max_seq_length // 4),
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    return questions, encoded


def _hf_f1(questions: list[tuple], encoded, starts, ends) -> float:
    """SQuAD v1.1 F1 (0-100) of the windows' logits (`_hf_read`'s questions and windows),
    decoded as run_qa.py's post-processing does: for each question, over all of its windows,
    the best start + end score among the 20 best starts and ends that lie in the context, end
    not before start, at most 30 tokens; scored by bertjax.tasks.qa.metrics, the official
    script's rules."""
    best: dict[int, tuple[float, str]] = {}
    for k, offsets in enumerate(encoded["offset_mapping"]):
        source = encoded["overflow_to_sample_mapping"][k]
        context_text = questions[source][2]
        in_context = [s == 1 for s in encoded.sequence_ids(k)]
        best_ends = np.argsort(ends[k])[::-1][:20]
        for s in np.argsort(starts[k])[::-1][:20]:
            for e in best_ends:
                if not (in_context[s] and in_context[e]) or e < s or e - s + 1 > 30:
                    continue
                score = float(starts[k][s] + ends[k][e])
                if source not in best or score > best[source][0]:
                    best[source] = (score, context_text[offsets[s][0] : offsets[e][1]])
    scores = [
        qa_metrics.f1_score(best.get(i, (0.0, ""))[1], gold)
        for i, (_, _, _, gold, _) in enumerate(questions)
    ]
    return 100.0 * float(np.mean(scores))


def _hf_windows(path: str, questions: list[tuple], encoded, training: bool) -> Examples:
    """`_hf_read`'s windows of the file at `path`, with their answers mapped by their offsets
    (run_qa.py's training features)."""
    starts, ends = [], []
    for k, offsets in enumerate(encoded["offset_mapping"]):
        _, _, _, text, answer_start = questions[encoded["overflow_to_sample_mapping"][k]]
        answer_end = answer_start + len(text)
        context = [i for i, s in enumerate(encoded.sequence_ids(k)) if s == 1]
        start = end = 0  # [CLS] when the window does not hold the answer
        if (
            context
            and offsets[context[0]][0] <= answer_start
            and offsets[context[-1]][1] >= answer_end
        ):
            start = next(i for i in context if offsets[i][1] > answer_start)
            end = max(i for i in context if offsets[i][0] < answer_end)
        starts.append(start)
        ends.append(end)
    features = {
        "input_ids": np.asarray(encoded["input_ids"], np.int32),
        "input_mask": np.asarray(encoded["attention_mask"], np.int32),
        "segment_ids": np.asarray(encoded["token_type_ids"], np.int32),
        "start_positions": np.asarray(starts, np.int32),
        "end_positions": np.asarray(ends, np.int32),
    }
    count = len(starts)
    return Examples("train" if training else "validation", path, features, [""] * count, True)


def torch_command(args) -> None:
    """The torch user's script of the whole command (run in a process of its own)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.init_from)
    train, dev = (os.path.join(args.torch_command, name) for name in ("train.json", "dev.json"))
    windows = _hf_windows(train, *_hf_read(tokenizer, train, args.max_seq_length), True)
    dev_questions, dev_encoded = _hf_read(tokenizer, dev, args.max_seq_length)
    held_out = _hf_windows(dev, dev_questions, dev_encoded, False)
    args.windows, args.rounds = len(windows), 1
    total = len(windows) // args.batch_size
    optimizer = optim.OptimizerSettings(
        learning_rate=3e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    side = Transformers(args, windows, optimizer, "grouped")
    train_seconds = _timed(side.run_epoch)
    side.windows = held_out
    start = time.perf_counter()
    starts, ends = side.predict()
    predict_seconds = time.perf_counter() - start
    f1 = _hf_f1(dev_questions, dev_encoded, starts, ends)
    loss = _span_loss(held_out.features, starts, ends)
    print(
        f"{len(windows)} training windows in {train_seconds:.1f} s, {len(held_out)} evaluation "
        f"windows in {predict_seconds:.1f} s; dev F1 {f1:.4f}, dev loss {loss:.4f}"
    )


def _span_loss(features: dict[str, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> float:
    """The windows' mean of the start and end cross-entropies over their real positions:
    finetune.py's eval/loss (bertjax.tasks.qa.model.qa_sums, which leaves out the positions
    past a batch's width, -inf here, with the rest of the padding)."""
    sums = qa_model.qa_sums(
        jnp.asarray(starts),
        jnp.asarray(ends),
        jnp.asarray(features["start_positions"]),
        jnp.asarray(features["end_positions"]),
        jnp.ones(len(starts)),
        jnp.asarray(features["input_mask"]),
    )
    return float(sums.loss / sums.count)


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _ratios(rates: dict[str, list[float]], ours: list[str], theirs: list[str]) -> None:
    for a in ours:
        for b in theirs:
            ratio = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
            print(f"{a} / {b}: {ratio:.2f}x")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Runs the benchmark, prints the tables and ratios; windows/s per side and phase."""
    args = parse_args(argv)
    if args.torch_command:
        torch_command(args)
        return {}
    if args.only_whole_command:
        print(f"versions: {versions()}")
        return whole_command(args)
    if args.compile_ahead_rounds:
        print(f"versions: {versions()}")
        return compile_ahead_rounds(args)
    command = [sys.executable, sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))
    print("command:", " ".join(shlex.quote(a) for a in command))
    print(f"versions: {versions()}")
    print(
        f"backend: {jax.default_backend()}, {jax.device_count()} x {jax.devices()[0].device_kind},"
        f" {os.cpu_count()} CPU cores"
    )
    if hasattr(os, "getloadavg"):
        print("load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    source = warm_start.open_source(args.init_from) if args.init_from else None
    if args.squad:
        windows = real_windows(args, source.tokenizer)
        print(f"windows: {len(windows)} from {args.squad}")
    else:
        windows = synthetic_windows(args)
    lengths = windows.features["input_mask"].sum(axis=1)
    print(
        "window lengths: "
        + ", ".join(f"p{q} {np.percentile(lengths, q):.0f}" for q in (10, 50, 90, 99))
        + f", max {lengths.max()}"
    )
    steps_per_epoch = len(windows) // args.batch_size
    capacity = widths_lib.fitting_capacity(windows, (0,), args.rounds + 1, args.batch_size, 1, 1)
    total = steps_per_epoch * (args.rounds + 1)
    optimizer = optim.OptimizerSettings(
        learning_rate=3e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    config = model_config(args, source)
    name = args.init_from or args.preset
    fill = float(windows.features["input_mask"].mean())
    print(
        f"model: {name} (L{config.num_layers}/H{config.hidden_size}/A{config.num_heads}, "
        f"V{config.vocab_size}) + qa_outputs, {args.dtype} compute"
        + (f" ({args.matmul_dtype} products)" if args.matmul_dtype else "")
        + f"; {len(windows)} windows, "
        f"batch {args.batch_size} x {args.max_seq_length}, {100 * fill:.1f} % of positions "
        f"real, token_capacity {capacity:.3f} when packing, {args.micro_batches} micro-batches "
        "when grouped by length"
    )
    grouped = f"bertjax grouped x{args.micro_batches}"
    train = {}
    if not args.grouped_only:
        train["bertjax padded"] = Bertjax(args, windows, optimizer, 1.0, 0, source=source)
        train["bertjax bucketed+packed"] = Bertjax(
            args, windows, optimizer, capacity, 32, source=source
        )
    train[grouped] = Bertjax(args, windows, optimizer, 1.0, 32, args.micro_batches, source)
    predict = {"bertjax predict": train[grouped]}
    modes = ("grouped",) if args.grouped_only else Transformers.MODES
    if not args.no_reference and torch is not None:
        for mode in modes:
            train[f"transformers {mode}"] = Transformers(args, windows, optimizer, mode)
            predict[f"transformers predict {mode}"] = train[f"transformers {mode}"]
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")
    for name, side in train.items():
        if isinstance(side, Bertjax):
            print(f"{name}: compiling every width {_timed(side.compile_widths):.1f} s")
        print(f"{name}: first epoch (compile / warm-up) {_timed(side.run_epoch):.1f} s")
    for name, side in predict.items():
        print(f"{name}: first pass (compile / warm-up) {_timed(side.predict):.1f} s")

    train_rates = {name: [] for name in train}
    predict_rates = {name: [] for name in predict}
    for round_index in range(args.rounds):
        for name, side in train.items():
            train_rates[name].append(steps_per_epoch / _timed(side.run_epoch))
        for name, side in predict.items():
            predict_rates[name].append(len(windows) / _timed(side.predict))
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)
    print()
    width = max(len(name) for name in (*train, *predict)) + 2
    print(f"{'training':<{width}}{'steps/s':>10}{'windows/s':>12}")
    for name, values in train_rates.items():
        median = statistics.median(values)
        print(f"{name:<{width}}{median:>10.3f}{median * args.batch_size:>12.2f}")
    print(f"{'prediction':<{width}}{'':>10}{'windows/s':>12}")
    for name, values in predict_rates.items():
        print(f"{name:<{width}}{'':>10}{statistics.median(values):>12.2f}")
    if "transformers grouped" in train:
        print()
        ours = [name for name in train if name.startswith("bertjax")]
        _ratios(train_rates, ours, [f"transformers {mode}" for mode in modes])
        _ratios(
            predict_rates, ["bertjax predict"], [f"transformers predict {mode}" for mode in modes]
        )
    result = {f"train {k}": statistics.median(v) for k, v in train_rates.items()}
    result.update({f"predict {k}": statistics.median(v) for k, v in predict_rates.items()})
    if not args.no_whole_command:
        result.update(whole_command(args))
    return result


if __name__ == "__main__":
    main()
