"""Encoder-decoder throughput: bertjax.tasks.seq2seq.model beside transformers' EncoderDecoderModel.

    python benchmarks/seq2seq.py [--layers 4] [--hidden 256] [--batch_size 16]
        [--source_length 32] [--max_new_tokens 32] [--repeats 3]

One random bert2bert-shaped model (rnd2rnd weights, vocabulary 8000), written with
bertjax.tasks.seq2seq.hf.save_seq2seq and read by transformers: the same weights and inputs
on both sides.
Generation runs greedy and beam search (4 beams) for bertjax with its key/value cache, for
bertjax recomputing the whole prefix every step (use_cache=False), and for transformers'
generate (its own cache); random weights almost never choose [SEP], so every row runs the full
max_new_tokens and tokens/s is batch x max_new_tokens / time. The tokens of bertjax and
transformers are compared and the count of rows that agree printed. Training runs one
optimizer step (AdamW, teacher forcing) per batch on each side: examples/s.

Times are the best of --repeats after a warm-up call (bertjax compiles there; its compile time
is printed). CPU only, one thread on each side by default (--threads): on a shared machine
torch's multi-threaded kernels wait on busy cores and slow down by an order of magnitude.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
THREADS = 1
for i, arg in enumerate(sys.argv):  # read before jax is imported: XLA fixes its pool then
    if arg.startswith("--threads"):
        THREADS = int(arg.split("=", 1)[1] if "=" in arg else sys.argv[i + 1])
if THREADS == 1:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
    ).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import linen as nn  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bertjax.encoders.bert.config import BertConfig  # noqa: E402
from bertjax.tasks.seq2seq import decoding  # noqa: E402
from bertjax.tasks.seq2seq import hf as seq2seq_hf  # noqa: E402
from bertjax.tasks.seq2seq import model as s2s  # noqa: E402

START, EOS = 2, 3


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return min(times)


def inputs(batch: int, length: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, size=(batch, length)).astype(np.int32)
    ids[:, 0] = START
    lengths = rng.integers(length // 2, length + 1, size=batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask > 0, ids, 0)
    ids[np.arange(batch), lengths - 1] = EOS
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--source_length", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--train_steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=THREADS, help="CPU threads per side")
    args = parser.parse_args()

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
    torch.set_num_threads(args.threads)
    model = transformers.EncoderDecoderModel.from_pretrained(directory).eval()
    ids, mask = inputs(args.batch_size, args.source_length, args.vocab, seed=1)
    tokens = args.batch_size * args.max_new_tokens
    print(
        f"model L{args.layers}/H{args.hidden} vocab {args.vocab}; batch {args.batch_size}, "
        f"source {args.source_length}, {args.max_new_tokens} new tokens; "
        f"{jax.device_count()} {jax.default_backend()} device(s), torch {torch.__version__}"
    )

    for beams in (1, 4):
        rates = {}
        outputs = {}
        for use_cache in (True, False):
            settings = decoding.GenerationSettings(
                max_new_tokens=args.max_new_tokens, num_beams=beams, use_cache=use_cache
            )

            def run(settings=settings):
                out = decoding.generate(config, params, ids, mask, settings=settings)
                jax.block_until_ready(out)
                return out

            begin = time.perf_counter()
            outputs[use_cache] = run()
            compile_s = time.perf_counter() - begin
            rates[use_cache] = tokens / best_time(run, args.repeats)
            print(
                f"  bertjax beams={beams} cache={use_cache}: {rates[use_cache]:,.0f} tokens/s "
                f"(first call {compile_s:.1f} s)"
            )

        def run_hf(beams=beams):
            with torch.no_grad():
                return model.generate(
                    input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    max_new_tokens=args.max_new_tokens,
                    num_beams=beams,
                    do_sample=False,
                )

        theirs = run_hf()
        hf_rate = tokens / best_time(run_hf, args.repeats)
        ours = decoding.strip(outputs[True], EOS)
        agree = 0
        for row, their_row in zip(ours, theirs[:, 1:].tolist()):
            agree += row == (their_row[: their_row.index(EOS)] if EOS in their_row else their_row)
        print(
            f"  transformers beams={beams}: {hf_rate:,.0f} tokens/s; bertjax cached / "
            f"transformers = {rates[True] / hf_rate:.2f}x; cached / uncached = "
            f"{rates[True] / rates[False]:.2f}x; rows with the same tokens: "
            f"{agree}/{args.batch_size}"
        )

    # Training: one AdamW step per batch, teacher forcing over max_new_tokens targets.
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
    jax.block_until_ready(step(jax_params, state))

    def train_ours():
        p, s = jax_params, state
        for _ in range(args.train_steps):
            p, s = step(p, s)
        jax.block_until_ready(p)

    ours_rate = args.train_steps * len(ids) / best_time(train_ours, args.repeats)
    model.train()
    for module in model.modules():  # the same numerics as bertjax's run: no dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    labels = torch.tensor(
        np.where(features["target_mask"] > 0, features["target_ids"], -100), dtype=torch.long
    )
    tensors = dict(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        decoder_input_ids=torch.tensor(features["decoder_input_ids"], dtype=torch.long),
    )

    def train_hf():
        for _ in range(args.train_steps):
            logits = model(**tensors).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
            )
            loss.backward()
            torch_opt.step()
            torch_opt.zero_grad()

    train_hf()
    hf_rate = args.train_steps * len(ids) / best_time(train_hf, args.repeats)
    print(
        f"  training: bertjax {ours_rate:,.0f} examples/s, transformers {hf_rate:,.0f} "
        f"examples/s, ratio {ours_rate / hf_rate:.2f}x"
    )


if __name__ == "__main__":
    main()
