"""Encoder-decoder throughput: bertjax.tasks.seq2seq.model beside transformers' EncoderDecoderModel.

    python -m benchmarks.seq2seq [--layers 4] [--hidden 256] [--batch_size 16]
        [--source_length 32] [--max_new_tokens 32] [--rounds 3]

One random bert2bert-shaped model (rnd2rnd weights, vocabulary 8000), written with
bertjax.tasks.seq2seq.hf.save_seq2seq and read by transformers: the same weights and inputs
on both sides.
Generation runs greedy and beam search (4 beams) for bertjax with its key/value cache, for
bertjax recomputing the whole prefix every step (use_cache=False), and for transformers'
generate (its own cache); random weights almost never choose [SEP], so every row runs the full
max_new_tokens and tokens/s is batch x max_new_tokens / time. The tokens of bertjax and
transformers are compared and the count of rows that agree printed. Training runs
--train_steps optimizer steps (AdamW, teacher forcing) per call on each side (transformers'
in the harness's torch loop): examples/s.

Times are medians of --rounds rounds of the sides in turn after a warm-up call each
(benchmarks.harness.timing; bertjax compiles there, its first call is printed). CPU only,
one thread on each side by default (--threads): on a shared machine torch's multi-threaded
kernels wait on busy cores and slow down by an order of magnitude.
"""  # noqa: E501

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from benchmarks.harness import reference, report, timing
from bertjax.encoders.bert.config import BertConfig
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from bertjax.tasks.seq2seq import model as s2s

START, EOS = 2, 3


def inputs(batch: int, length: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, size=(batch, length)).astype(np.int32)
    ids[:, 0] = START
    lengths = rng.integers(length // 2, length + 1, size=batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask > 0, ids, 0)
    ids[np.arange(batch), lengths - 1] = EOS
    return ids, mask


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--source_length", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--train_steps", type=int, default=5, help="optimizer steps per call")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per side")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per side")
    report.add_json_flag(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report.use_cpu()
    if args.threads == 1:  # XLA reads it when jax makes its CPU client, below
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_multi_thread_eigen=false"
        os.environ["XLA_FLAGS"] = flags.strip()
    reference.use_threads(args.threads)
    machine = report.start("seq2seq", argv)
    bert = BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(128, args.source_length, args.max_new_tokens + 1),
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    config = s2s.Seq2SeqConfig(bert, START, EOS, init=s2s.RND2RND)
    params = jax.tree.map(np.asarray, nn.meta.unbox(s2s.init_params(config, jax.random.key(0))))
    directory = pathlib.Path(tempfile.mkdtemp()) / "model"
    seq2seq_hf.save_seq2seq(config, params, directory)
    torch = reference.torch
    model = reference.transformers.EncoderDecoderModel.from_pretrained(directory).eval()
    ids, mask = inputs(args.batch_size, args.source_length, args.vocab, seed=1)
    tokens = args.batch_size * args.max_new_tokens
    print(
        f"model L{args.layers}/H{args.hidden} vocab {args.vocab}; batch {args.batch_size}, "
        f"source {args.source_length}, {args.max_new_tokens} new tokens; "
        f"{jax.device_count()} {jax.default_backend()} device(s), {args.threads} thread(s) a side"
    )
    figures: dict[str, Any] = {}
    for beams in (1, 4):
        outputs: dict[str, Any] = {}

        def ours(use_cache: bool, beams: int = beams, outputs: dict = outputs):
            settings = decoding.GenerationSettings(
                max_new_tokens=args.max_new_tokens, num_beams=beams, use_cache=use_cache
            )
            outputs[use_cache] = decoding.generate(config, params, ids, mask, settings=settings)
            return outputs[use_cache]

        def theirs(beams: int = beams, outputs: dict = outputs):
            with torch.no_grad():
                outputs["transformers"] = model.generate(
                    input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    max_new_tokens=args.max_new_tokens,
                    num_beams=beams,
                    do_sample=False,
                )

        found = timing.time_rounds(
            {
                "cached": lambda: ours(True),
                "uncached": lambda: ours(False),
                "transformers": theirs,
            },
            rounds=args.rounds,
        )
        for use_cache in ("cached", "uncached"):
            print(
                f"  bertjax beams={beams} {use_cache}: {found[use_cache].rate(tokens):,.0f} "
                f"tokens/s (first call {found[use_cache].first:.1f} s)"
            )
        agree = 0
        for row, their_row in zip(
            decoding.strip(outputs[True], EOS), outputs["transformers"][:, 1:].tolist()
        ):
            agree += row == (their_row[: their_row.index(EOS)] if EOS in their_row else their_row)
        ratio = timing.ratio(found["transformers"], found["cached"])
        print(
            f"  transformers beams={beams}: {found['transformers'].rate(tokens):,.0f} tokens/s; "
            f"bertjax cached / transformers = {ratio:.2f}x; cached / uncached = "
            f"{timing.ratio(found['uncached'], found['cached']):.2f}x; rows with the same "
            f"tokens: {agree}/{args.batch_size}"
        )
        figures[f"beams {beams}"] = {name: found[name].rate(tokens) for name in found} | {
            "cached / transformers": ratio,
            "rows agreeing": agree,
        }

    # Training: optimizer steps, teacher forcing over max_new_tokens targets.
    rng = np.random.default_rng(2)
    targets = [rng.integers(4, args.vocab, size=args.max_new_tokens - 1).tolist()] * len(ids)
    features = s2s.target_features(targets, args.max_new_tokens, START, EOS)
    batch = dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids), **features)
    optimizer = optax.adamw(1e-4)

    @jax.jit
    def step(params, state):
        def loss(p):
            sums = s2s.batch_loss_sums(config, p, batch)
            return sums.loss / sums.count

        grads = jax.grad(loss)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    jax_params = jax.tree.map(jnp.asarray, params)
    state = optimizer.init(jax_params)

    def train_ours():
        p, s = jax_params, state
        for _ in range(args.train_steps):
            p, s = step(p, s)
        return p

    model.train()
    for module in model.modules():  # the same numerics as bertjax's run: no dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    torch_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    labels = np.where(features["target_mask"] > 0, features["target_ids"], -100)
    tensors = {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long),
        "decoder_input_ids": torch.tensor(features["decoder_input_ids"], dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
    }

    def token_loss(model, batch):
        labels = batch["labels"]
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )

    def train_theirs():
        steps = [tensors] * args.train_steps
        return reference.train(model, steps, torch_optimizer, loss=token_loss)

    found = timing.time_rounds(
        {"bertjax": train_ours, "transformers": train_theirs}, rounds=args.rounds
    )
    examples = args.train_steps * len(ids)
    ratio = timing.ratio(found["transformers"], found["bertjax"])
    print(
        f"  training: bertjax {found['bertjax'].rate(examples):,.0f} examples/s, transformers "
        f"{found['transformers'].rate(examples):,.0f} examples/s, ratio {ratio:.2f}x"
    )
    figures["training"] = {name: found[name].rate(examples) for name in found} | {"ratio": ratio}
    report.finish("seq2seq", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
