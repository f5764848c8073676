"""How many steps a tiny encoder needs before it can compare a token with the one before it.

    python benchmarks/previous_token.py [--steps 1500] [--every 100] [--vocab 50]

Replaced-token detection asks the discriminator whether each token fits its context, so it
learns nothing until the encoder can look at its neighbours. This measures how long that
takes, on the simplest such task: rows of 64 random tokens (from --vocab) in which 15% of
the tokens are replaced by a copy of the token before them, a discriminator head (dense ->
GELU -> dense, ELECTRA's) labelling every token "copied" or not, trained from scratch with
Adam at 1e-3, batches of 32, on fresh rows each step. The token alone says nothing (a copy
is as frequent as any token); only the token before it does.

Two tiny encoders (L2/H128/A2, no dropout, initial weights drawn at 0.05 as the CPU demos do):
  bert        BERT's (and ELECTRA's) encoder: learned absolute position embeddings;
  modernbert  ModernBERT's: rotary positions, which give every head relative offsets from
              the start.
Every --every steps it prints the training loss (0.42 is what the base rate alone gives) and
recall and precision on copied tokens over the last batch.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from bertjax.encoders.bert.config import BertConfig  # noqa: E402
from bertjax.encoders.bert.model import BertModel  # noqa: E402
from bertjax.encoders.modernbert.config import ModernBertConfig  # noqa: E402
from bertjax.encoders.modernbert.model import ModernBertModel  # noqa: E402

SEQ, BATCH, COPIED, RATE = 64, 32, 0.15, 1e-3


class Detector(nn.Module):
    """An encoder and ELECTRA's discriminator head: a logit per token [b, s]."""

    family: str
    vocab: int

    @nn.compact
    def __call__(self, ids):
        mask = jnp.ones_like(ids)
        if self.family == "bert":
            config = BertConfig.preset(
                "tiny",
                vocab_size=self.vocab,
                max_position_embeddings=SEQ,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                initializer_range=0.05,
            )
            x, _ = BertModel(config)(ids, jnp.zeros_like(ids), mask)  # [b, s, h]
        else:
            config = ModernBertConfig(
                vocab_size=self.vocab,
                hidden_size=128,
                intermediate_size=256,
                num_layers=2,
                num_heads=2,
                local_attention=SEQ,
                initializer_range=0.05,
                pad_token_id=0,
                cls_token_id=1,
                sep_token_id=2,
                dtype="float32",
            )
            x = ModernBertModel(config)(ids, mask)  # [b, s, h]
        hidden = nn.gelu(nn.Dense(x.shape[-1])(x))  # [b, s, h]
        return nn.Dense(1)(hidden)[..., 0]  # [b, s]


def rows(rng: np.random.Generator, vocab: int) -> tuple[jax.Array, jax.Array]:
    """(ids [b, s] with COPIED of the tokens replaced by the one before, labels [b, s])."""
    ids = rng.integers(5, vocab, size=(BATCH, SEQ))
    copied = rng.random((BATCH, SEQ)) < COPIED
    copied[:, 0] = False
    corrupted = ids.copy()
    corrupted[:, 1:] = np.where(copied[:, 1:], ids[:, :-1], ids[:, 1:])
    labels = (corrupted != ids).astype(np.float32)  # a copy of an equal token is no change
    return jnp.asarray(corrupted, jnp.int32), jnp.asarray(labels)


def run(family: str, args) -> None:
    model = Detector(family, args.vocab)
    params = model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))["params"]
    params = nn.meta.unbox(params)
    optimizer = optax.adam(RATE)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, ids, labels):
        def loss_fn(p):
            logits = model.apply({"params": p}, ids)  # [b, s]
            return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels)), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, logits

    rng = np.random.default_rng(0)
    for index in range(args.steps):
        ids, labels = rows(rng, args.vocab)
        params, state, loss, logits = step(params, state, ids, labels)
        if (index + 1) % args.every == 0:
            called = np.asarray(logits) > 0
            truth = np.asarray(labels) > 0
            found = (called & truth).sum()
            print(
                f"{family:10s} step {index + 1:5d} loss {float(loss):.3f} "
                f"recall {found / truth.sum():.3f} precision {found / max(called.sum(), 1):.3f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=50)
    parser.add_argument("--families", nargs="+", default=["bert", "modernbert"])
    args = parser.parse_args()
    for family in args.families:
        run(family, args)


if __name__ == "__main__":
    main()
