"""Question-answering throughput: bertjax's QA training and prediction beside transformers'
BertForQuestionAnswering, on the same model and the same windows.

    python -m benchmarks.qa                       # BERT-small (L4/H512/A8), B32, S384
    python -m benchmarks.qa --preset base --windows 512 --dtype bfloat16   # accelerators

Windows are SQuAD-shaped ([CLS] question [SEP] context [SEP], run_squad.py's
max_seq_length 384): random ids, a question of --question_lengths pieces and a context of
--context_lengths pieces (the default, 100 to 250, is about SQuAD v1.1's paragraphs), an
answer span of 1 to 5 tokens inside the context. bertjax runs a question_answering epoch as
finetune.py runs it (benchmarks.harness.finetuning: the task's objective built by
build_finetuning, host batches from the epoch's permutation, the jitted donated step with
google's AdamW recipe) three ways: padded to max_seq_length; with finetune.py's defaults (the
run's widths, multiples of 32, and token packing); and grouped by length into --micro_batches
micro-batches (config.grad_accum_steps). transformers trains BertForQuestionAnswering in the
harness's torch loop (benchmarks.harness.reference.TorchEpochs) on the padded batches, on
batches padded to their longest window and grouped by length. Prediction: the windows' start
and end logits, bertjax as the fine-tuning loop evaluates (finetune.evaluation.run_eval),
transformers in torch.no_grad.

Steady state: bertjax compiles its step and evaluation at every width the run meets before
timing, as a long run has after its first steps; every side runs one untimed epoch and
prediction pass; then --rounds rounds run every side in turn (benchmarks.harness.timing), and
ratios are taken within each round and their median printed.

The whole command (a user's clock, skipped with --no_whole_command): `python finetune.py
--config.task=question_answering` for one epoch on the same windows (written as a SQuAD JSON
file: the --squad file's first --windows questions, or synthetic paragraphs of the same
lengths, and a quarter as many questions to evaluate), timed from its start to its exit
(start-up, reading, compiling, training, evaluation with decoding and F1, predictions and
checkpoints), twice: with an empty compilation cache, then with the cache the first run
filled (bertjax.engine.compilation_cache). Beside it the same as a torch user's script does it:
transformers' tokenizer windows the file (as run_qa.py), BertForQuestionAnswering trains one
epoch by the grouped torch loop and predicts every evaluation window's logits, timed from
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
import tempfile
from typing import Any

import jax.numpy as jnp
import numpy as np

from benchmarks.harness import commands, finetuning, fixtures, report, timing
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import PRESETS, BertConfig
from bertjax.engine import optim
from bertjax.finetune import warm_start, widths
from bertjax.finetune.task import Examples
from bertjax.tasks.qa import metrics as qa_metrics
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad
from bertjax.tasks.qa import task as qa_task

try:  # the reference is optional: torch and transformers live in the `hf` extra
    from benchmarks.harness import reference
except ImportError:  # pragma: no cover - depends on the environment
    reference = None

HEAD = HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS)
TARGETS = ("start_positions", "end_positions")
# A SQuAD question as the whole command's files hold it.
Question = tuple[str, str, str, str, int]  # (id, question, context, answer text, answer start)


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
    report.add_json_flag(parser)
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
    """SQuAD-shaped windows of random ids (fixtures.sentence_pairs: [CLS] question [SEP]
    context [SEP]) with an answer span of 1 to 5 tokens in each context."""
    rng = np.random.default_rng(args.seed)
    features, starts = fixtures.sentence_pairs(
        rng,
        args.windows,
        args.max_seq_length,
        args.question_lengths,
        args.context_lengths,
        args.vocab_size,
    )
    contexts = features["input_mask"].sum(axis=1) - starts - 1  # [window] context tokens
    first = starts + rng.integers(0, np.maximum(contexts - 4, 1))
    features["start_positions"] = first.astype(np.int32)
    last = np.minimum(first + rng.integers(0, 5, args.windows), starts + contexts - 1)
    features["end_positions"] = last.astype(np.int32)
    return Examples("train", "synthetic", features, [str(i) for i in range(args.windows)], True)


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


def torch_side(args, windows: Examples, optimizer, mode: str):
    """transformers' BertForQuestionAnswering in the harness's torch loop."""
    reference.torch.manual_seed(args.seed)
    if args.init_from:
        model = reference.transformers.BertForQuestionAnswering.from_pretrained(args.init_from)
    else:
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
        model = reference.transformers.BertForQuestionAnswering(
            reference.bert_config(config, max_position_embeddings=max(512, args.max_seq_length))
        )
    if args.torch_head_init == "google":  # as bertjax starts a fresh head
        with reference.torch.no_grad():
            reference.torch.nn.init.trunc_normal_(
                model.qa_outputs.weight, std=0.02, a=-0.04, b=0.04
            )
            model.qa_outputs.bias.zero_()
    return reference.TorchEpochs(
        model,
        windows,
        optimizer,
        mode,
        batch_size=args.batch_size,
        micro_batches=args.micro_batches,
        targets=TARGETS,
        autocast=reference.torch.bfloat16 if args.dtype == "bfloat16" else None,
    )


def torch_logits(side) -> tuple[np.ndarray, np.ndarray]:
    """The side's start and end logits [windows, max_seq_length] in the windows' order
    (-inf past a batch's width)."""
    shape = side.examples.features["input_ids"].shape
    starts, ends = np.full(shape, -np.inf, np.float32), np.full(shape, -np.inf, np.float32)
    for rows, out in side.forward():
        width = out.start_logits.shape[1]
        starts[rows, :width] = out.start_logits.float().cpu().numpy()
        ends[rows, :width] = out.end_logits.float().cpu().numpy()
    return starts, ends


# ----------------------------------------------------------------------------- the whole command


def squad_file(path: str, questions: list[Question]) -> None:
    """Writes questions as a SQuAD v1.1 file, one paragraph per question."""
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


def real_questions(path: str, count: int) -> list[Question]:
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


def synthetic_questions(args, words: list[str], count: int, rng) -> list[Question]:
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
        question = " ".join(rng.choice(words, q))
        out.append((f"q{k}", question, " ".join(context_words), " ".join(answer_words), start))
    return out


def command_inputs(args, directory: str) -> tuple[str, str, str]:
    """(init_from, training file, evaluation file) of the whole command, written in
    `directory`: the --init_from model or a random --preset one with a vocabulary of one-token
    words (fixtures.random_bert_directory), and SQuAD files of --windows questions and a
    quarter as many."""
    rng = np.random.default_rng(args.seed)
    count, held_out = args.windows, max(args.batch_size, args.windows // 4)
    init_from = args.init_from
    if not init_from:
        init_from = os.path.join(directory, "model")
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
        fixtures.random_bert_directory(init_from, config, seed=args.seed)
        words = fixtures.words(args.vocab_size - len(fixtures.SPECIAL_PIECES))
    else:
        with open(os.path.join(init_from, "vocab.txt")) as f:
            words = [w for w in f.read().split() if w.isalpha() and w.islower()]
    if args.squad:
        questions = real_questions(args.squad, count + held_out)
    else:
        questions = synthetic_questions(args, words, count + held_out, rng)
    train, dev = os.path.join(directory, "train.json"), os.path.join(directory, "dev.json")
    squad_file(train, questions[:count])
    squad_file(dev, questions[count:])
    return init_from, train, dev


def finetune_command(args, directory: str, name: str, cache: str, inputs) -> list[str]:
    """finetune.py's command line for one epoch of the benchmark's windows."""
    init_from, train, dev = inputs
    return commands.script(
        "finetune.py",
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
    )


def compile_ahead_rounds(args) -> dict[str, float]:
    """Times finetune.py's whole command with config.compile_ahead=0 and =1 alternately (the
    first of each round alternating too), each run with an empty compilation cache of its own;
    prints each round's ratio and their median."""
    with tempfile.TemporaryDirectory(prefix="bertjax-qa-") as directory:
        inputs = command_inputs(args, directory)
        env = commands.without_compilation_cache()
        print(f"\nwhole command, compiled ahead or not: 1 epoch of {inputs[1]}, empty caches")
        times: dict[int, list[float]] = {0: [], 1: []}
        for round_ in range(args.compile_ahead_rounds):
            # Which goes first alternates: a busy host's load drifts within a round.
            for threads in (0, 1) if round_ % 2 == 0 else (1, 0):
                name = f"ahead {threads} round {round_}"
                cache = os.path.join(directory, f"xla {name}")
                command = finetune_command(args, directory, name, cache, inputs)
                seconds, out = commands.run([*command, f"--config.compile_ahead={threads}"], env)
                found = commands.finetune_summary(out)
                f1 = commands.last_metric(out, "eval/f1")
                print(
                    f"  compile_ahead={threads}, round {round_}: {seconds:.1f} s"
                    + (
                        f" (compiling {found.compile_s} s, {found.compiled} programs)"
                        if found
                        else ""
                    )
                    + (f", eval/f1 {f1}" if f1 is not None else ""),
                    flush=True,
                )
                times[threads].append(seconds)
            print(f"    round {round_}: off / on {times[0][-1] / times[1][-1]:.2f}x", flush=True)
        off, on = (timing.Timing(f"compile_ahead={k}", tuple(times[k])) for k in (0, 1))
        ratio = timing.ratio(off, on)
        print(f"  compile_ahead=1 over 0, median of rounds: {ratio:.2f}x (above 1: faster)")
    return {"compile_ahead=0": off.figures(), "compile_ahead=1": on.figures(), "ratio": ratio}


def whole_command(args) -> dict[str, float]:
    """Times finetune.py's whole command cold and warm, and the torch script; prints them."""
    with tempfile.TemporaryDirectory(prefix="bertjax-qa-") as directory:
        inputs = command_inputs(args, directory)
        init_from, train, dev = inputs
        env = commands.without_compilation_cache()
        cache = os.path.join(directory, "xla")
        result = {}
        print(f"\nwhole command: 1 epoch of {train} (evaluated on {dev}), process start to exit")
        for name in ("empty compilation cache", "second run, cache warm"):
            command = finetune_command(args, directory, name, cache, inputs)
            seconds, out = commands.run(command, env)
            found = commands.finetune_summary(out) or commands.FinetuneSummary(
                float("nan"), float("nan"), -1, -1
            )
            f1 = commands.last_metric(out, "eval/f1")
            print(
                f"  bertjax finetune.py, {name}: {seconds:.1f} s (inside the run "
                f"{found.wall_s:.1f} s, compiling {found.compile_s:.1f} s: {found.compiled} "
                f"programs compiled, {found.loaded} loaded"
                + (f"; eval/f1 {f1}" if f1 is not None else "")
                + ")"
            )
            result[f"command bertjax {name} s"] = seconds
            if f1 is not None:
                result["dev F1 bertjax"] = f1
        if not args.no_reference and reference is not None:
            torch_args = commands.module(
                "benchmarks.qa",
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
            )
            seconds, out = commands.run(torch_args, env)
            summary = next((line for line in out.splitlines() if "dev F1" in line), "")
            print(f"  transformers grouped torch loop: {seconds:.1f} s ({summary})")
            result["command transformers grouped s"] = seconds
            torch_f1 = commands.last_metric(out, "dev F1")
            if torch_f1 is not None and "dev F1 bertjax" in result:
                result["dev F1 transformers"] = torch_f1
                difference = result["dev F1 bertjax"] - torch_f1
                print(f"  dev F1, bertjax - transformers: {difference:+.4f} (F1 in 0-100)")
            torch_loss = commands.last_metric(out, "dev loss")
            if torch_loss is not None:
                print(f"  transformers dev loss (over real positions): {torch_loss}")
            for name in ("empty compilation cache", "second run, cache warm"):
                ratio = seconds / result[f"command bertjax {name} s"]
                print(f"  bertjax ({name}) / transformers: {ratio:.2f}x")
    return result


def hf_read(tokenizer, path: str, max_seq_length: int) -> tuple[list[Question], Any]:
    """A SQuAD file's questions and their windows as transformers' tokenizer cuts them for
    run_qa.py (the context truncated into windows overlapping by 128 tokens; offsets and each
    window's source question kept)."""
    questions = real_questions(path, 10**9)
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


def hf_f1(questions: list[Question], encoded, starts, ends) -> float:
    """SQuAD v1.1 F1 (0-100) of the windows' logits (`hf_read`'s questions and windows),
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


def hf_windows(path: str, questions: list[Question], encoded, training: bool) -> Examples:
    """`hf_read`'s windows of the file at `path`, with their answers mapped by their offsets
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
    reference.use_threads()
    tokenizer = reference.transformers.AutoTokenizer.from_pretrained(args.init_from)
    train, dev = (os.path.join(args.torch_command, name) for name in ("train.json", "dev.json"))
    windows = hf_windows(train, *hf_read(tokenizer, train, args.max_seq_length), True)
    dev_questions, dev_encoded = hf_read(tokenizer, dev, args.max_seq_length)
    held_out = hf_windows(dev, dev_questions, dev_encoded, False)
    total = len(windows) // args.batch_size
    optimizer = optim.OptimizerSettings(
        learning_rate=3e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    side = torch_side(args, windows, optimizer, "grouped")
    train_seconds = timing.time_call(side.run_epoch, rounds=1, warmup=0).median
    side.examples = held_out
    elapsed = timing.stopwatch()
    starts, ends = torch_logits(side)
    predict_seconds = elapsed()
    f1 = hf_f1(dev_questions, dev_encoded, starts, ends)
    loss = span_loss(held_out.features, starts, ends)
    print(
        f"{len(windows)} training windows in {train_seconds:.1f} s, {len(held_out)} evaluation "
        f"windows in {predict_seconds:.1f} s; dev F1 {f1:.4f}, dev loss {loss:.4f}"
    )


def span_loss(features: dict[str, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> float:
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, prints the tables and ratios; returns the row's figures (windows/s
    per side and phase, and the whole command's seconds)."""
    args = parse_args(argv)
    if args.torch_command:
        torch_command(args)
        return {}
    machine = report.start("qa", argv)
    if args.only_whole_command or args.compile_ahead_rounds:
        run = whole_command if args.only_whole_command else compile_ahead_rounds
        figures = run(args)
        report.finish("qa", args, figures, machine)
        return figures
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
    epochs = args.rounds + 1
    capacity = widths.fitting_capacity(windows, (0,), epochs, args.batch_size, 1, 1)
    total = len(windows) // args.batch_size * epochs
    optimizer = optim.OptimizerSettings(
        learning_rate=3e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    config = model_config(args, source)
    fill = float(windows.features["input_mask"].mean())
    print(
        f"model: {args.init_from or args.preset} (L{config.num_layers}/H{config.hidden_size}/"
        f"A{config.num_heads}, V{config.vocab_size}) + qa_outputs, {args.dtype} compute"
        + (f" ({args.matmul_dtype} products)" if args.matmul_dtype else "")
        + f"; {len(windows)} windows, batch {args.batch_size} x {args.max_seq_length}, "
        f"{100 * fill:.1f} % of positions real, token_capacity {capacity:.3f} when packing, "
        f"{args.micro_batches} micro-batches when grouped by length"
    )

    def ours(capacity: float, bucket: int, micro: int = 1) -> finetuning.Epochs:
        return finetuning.Epochs(
            config,
            HEAD,
            windows,
            optimizer,
            batch_size=args.batch_size,
            epochs=epochs,
            seed=args.seed,
            token_capacity=capacity,
            length_bucket=bucket,
            micro_batches=micro,
            source=source,
        )

    grouped = f"bertjax grouped x{args.micro_batches}"
    train: dict[str, Any] = {}
    if not args.grouped_only:
        train["bertjax padded"] = ours(1.0, 0)
        train["bertjax cut+packed"] = ours(capacity, 32)
    train[grouped] = ours(1.0, 32, args.micro_batches)
    print(f"widths of {grouped}: {train[grouped].widths()}")
    predict: dict[str, Any] = {"predict bertjax": lambda: train[grouped].predict()}
    modes = ("grouped",) if args.grouped_only else reference.TorchEpochs.MODES if reference else ()
    if not args.no_reference and reference is not None:
        reference.use_threads()
        for mode in modes:
            side = torch_side(args, windows, optimizer, mode)
            train[f"transformers {mode}"] = side
            predict[f"predict transformers {mode}"] = lambda side=side: torch_logits(side)
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")
    for name, side in train.items():
        if isinstance(side, finetuning.Epochs):
            seconds = timing.time_call(side.compile_widths, rounds=1, warmup=0).median
            print(f"{name}: compiling every width {seconds:.1f} s")

    def progress(index: int, seconds: dict[str, float]) -> None:
        print(f"round {index + 1}/{args.rounds} done", flush=True)

    trained = timing.time_rounds(
        {name: side.run_epoch for name, side in train.items()},
        rounds=args.rounds,
        on_round=progress,
    )
    predicted = timing.time_rounds(predict, rounds=args.rounds)
    print()
    width = max(len(name) for name in (*train, *predict)) + 2
    print(f"{'training':<{width}}{'steps/s':>10}{'windows/s':>12}")
    steps_per_epoch = len(windows) // args.batch_size
    for name, found in trained.items():
        rate = found.rate(steps_per_epoch)
        print(f"{name:<{width}}{rate:>10.3f}{rate * args.batch_size:>12.2f}")
    print(f"{'prediction':<{width}}{'':>10}{'windows/s':>12}")
    for name, found in predicted.items():
        print(f"{name:<{width}}{'':>10}{found.rate(len(windows)):>12.2f}")
    figures: dict[str, Any] = {
        f"train {k} windows/s": v.rate(steps_per_epoch * args.batch_size)
        for k, v in trained.items()
    }
    figures |= {f"{k} windows/s": v.rate(len(windows)) for k, v in predicted.items()}
    if "transformers grouped" in train:
        print()
        for a in (name for name in train if name.startswith("bertjax")):
            for mode in modes:
                ratio = timing.ratio(trained[f"transformers {mode}"], trained[a])
                figures[f"train {a} / transformers {mode}"] = ratio
                print(f"{a} / transformers {mode}: {ratio:.2f}x")
        for mode in modes:
            theirs = predicted[f"predict transformers {mode}"]
            ratio = timing.ratio(theirs, predicted["predict bertjax"])
            figures[f"predict bertjax / transformers {mode}"] = ratio
            print(f"predict bertjax / transformers {mode}: {ratio:.2f}x")
    if not args.no_whole_command:
        figures.update(whole_command(args))
    report.finish("qa", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
