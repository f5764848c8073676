"""What a replaced-token detector can learn from which replacements, on the CPU demo's data.

    python benchmarks/rtd_replacements.py --data runs/electra_tiny/data
        [--replacements generator uniform unigram neighbour] [--steps 300] [--every 50]

Trains configs/electra_tiny.py's two networks (the discriminator L2/H128, the generator half
as wide, shared embeddings, lambda 50, AdamW with the demo's warmup and linear decay) on the
demo's prepared data (`python train.py --config configs/electra_tiny.py --workdir
runs/electra_tiny` writes it), the masked positions filled four ways:

  generator  ELECTRA's: drawn from the generator (the objective as it trains);
  uniform    a token drawn uniformly from the vocabulary, whatever the generator says;
  unigram    a token drawn from the training rows' own tokens (the corpus's unigram
             distribution), whatever the generator says;
  neighbour  the original token just before the position (a row reads "x x" there): found
             by looking one token back, a task of context alone but the simplest one.

A uniform draw is told apart by the token alone (a rare piece is likely a replacement); a
unigram draw only by its context, which is also what the generator's draws need once the
generator knows the unigram distribution; a neighbour's copy by whether a token repeats the
one before it, which needs attention to the previous position and nothing else. Every
--every steps it prints the discriminator's accuracy beside calling every token original,
its precision, recall and AUC on replaced tokens over those steps' training batches, and the
generator's accuracy.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from bertjax.data.loader import make_loader  # noqa: E402
from bertjax.data.masking import MaskingSettings  # noqa: E402
from bertjax.encoders.electra import generator as generator_lib  # noqa: E402
from bertjax.encoders.electra import rtd as rtd_model  # noqa: E402
from bertjax.encoders.electra.config import ElectraConfig  # noqa: E402
from bertjax.pretrain import objectives  # noqa: E402
from bertjax.pretrain.objectives.rtd.objective import (  # noqa: E402
    RtdLoss,
    gumbel_sample,
    originals,
)
from configs import electra_tiny  # noqa: E402

SHOWN = (
    "discriminator_accuracy",
    "all_original_accuracy",
    "replaced_precision",
    "replaced_recall",
    "replaced_auc",
    "generator_accuracy",
)


def _unigram_table(data: str, masking: MaskingSettings, rows: int = 640) -> jax.Array:
    """Non-special tokens of the first training rows: drawing from them draws the unigram
    distribution."""
    loader = make_loader(data, batch_size=32, seed=1, masking=masking)
    tokens = []
    for _, batch in zip(range(rows // 32), loader):
        ids = batch["input_ids"]
        tokens.append(ids[(ids > 4) & (batch["input_mask"] > 0)])
    return jnp.asarray(np.concatenate(tokens))


def sampler(name: str, vocab_size: int, table: jax.Array):
    """`(logits [b, p, v], key, batch) -> replacements [b, p]` of a --replacements name."""
    if name == "generator":
        return lambda logits, key, batch: gumbel_sample(logits, key)
    if name == "uniform":
        return lambda logits, key, batch: jax.random.randint(key, logits.shape[:-1], 5, vocab_size)
    if name == "neighbour":

        def previous_token(logits, key, batch):
            before = jnp.maximum(jnp.asarray(batch["masked_lm_positions"]) - 1, 0)  # [b, p]
            return jnp.take_along_axis(originals(batch), before.astype(jnp.int32), axis=1)

        return previous_token
    return lambda logits, key, batch: table[
        jax.random.randint(key, logits.shape[:-1], 0, len(table))
    ]


class ReplacedBy(RtdLoss):
    """RTD's step with the replacements drawn by `sampler` (which may read the batch)."""

    def __init__(self, model, weight, draw):
        super().__init__(model, weight, sample=lambda logits, key: draw(logits, key, self.batch))

    def sums(self, params, batch, **kwargs):
        self.batch = batch  # read by the sampler within this same trace
        return super().sums(params, batch, **kwargs)


def run(name: str, args, config, table) -> None:
    settings = config.model
    model_config = ElectraConfig.preset(
        settings.preset,
        vocab_size=config.data.vocab_size,
        max_position_embeddings=config.data.max_seq_length,
        hidden_dropout=settings.hidden_dropout,
        attention_dropout=settings.attention_dropout,
        initializer_range=settings.initializer_range,
    )
    generator = generator_lib.generator_config(model_config, config.generator_hidden_fraction)
    params = nn.meta.unbox(rtd_model.init(model_config, generator)(jax.random.key(0)))
    step = ReplacedBy(
        rtd_model.ReplacedTokenDetection(model_config, generator),
        config.rtd_weight,
        sampler(name, model_config.vocab_size, table),
    )
    rate, warmup = config.optimizer.learning_rate, config.optimizer.warmup_steps
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, rate, warmup), optax.linear_schedule(rate, 0.0, args.steps)],
        [warmup],
    )
    optimizer = optax.adamw(schedule, weight_decay=config.optimizer.weight_decay)
    state = optimizer.init(params)

    @jax.jit
    def train(params, state, batch, key):
        def loss(p):
            sums = step.sums(p, batch, rng=key, deterministic=False)
            return step.loss(sums, step.denominators(batch)), sums

        (_, sums), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, sums

    masking = objectives.get("rtd").masking(MaskingSettings(), config.data.max_seq_length)
    loader = make_loader(args.data, batch_size=config.batch_size, seed=0, masking=masking)
    start, totals = time.perf_counter(), None
    for index, batch in zip(range(args.steps), loader):
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        params, state, sums = train(params, state, batch, jax.random.key(index))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        if (index + 1) % args.every == 0:
            metrics = step.metrics(totals, "train")
            shown = " ".join(f"{k} {float(metrics['train/' + k]):.3f}" for k in SHOWN)
            print(f"{name:9s} step {index + 1:5d} ({time.perf_counter() - start:5.0f} s) {shown}")
            totals = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the demo run's prepared data directory")
    parser.add_argument(
        "--replacements", nargs="+", default=["generator", "uniform", "unigram", "neighbour"]
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args()
    config = electra_tiny.get_config()
    masking = objectives.get("rtd").masking(MaskingSettings(), config.data.max_seq_length)
    table = _unigram_table(args.data, masking)
    for name in args.replacements:
        run(name, args, config, table)


if __name__ == "__main__":
    main()
