"""ModernBERT's small config, batches and the transformers side of its parity checks (torch
and transformers imported inside the functions that use them)."""

import functools

import jax
import numpy as np

from bertjax.encoders.modernbert.config import ModernBertConfig
from tests.helpers.batches import padded_batch
from tests.helpers.encoders import _torch

ATOL = 1e-5


# Logits reach about 4.4 with these random weights; 2e-5 is some 40 float32 ulps there.
LOGITS_ATOL = 2e-5


# Small, with every dimension distinct so that a swapped axis shows: 4 layers (0 and 3
# global, 1 and 2 local), a window of +-4 on sequences of 32, so the local layers matter.
# Special ids inside the small vocabulary.
SMALL = ModernBertConfig(
    vocab_size=99,
    hidden_size=32,
    intermediate_size=48,
    num_layers=4,
    num_heads=4,
    max_position_embeddings=64,
    local_attention=8,
    global_rope_theta=1000.0,
    local_rope_theta=100.0,
    pad_token_id=0,
    cls_token_id=1,
    sep_token_id=2,
    dtype="float32",
)


ALL_BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)


SEQ = 32


LENGTHS = (SEQ, 20, 9)  # real tokens per row; the rest is padding


def _batch(config=SMALL, lengths=LENGTHS, seq=SEQ, seed=0):
    """(ids, mask) [len(lengths), seq]: [CLS] and random tokens, then padding."""
    return padded_batch(
        lengths,
        seq,
        vocab_size=config.vocab_size,
        first_word=3,
        cls_id=config.cls_token_id,
        pad_id=config.pad_token_id,
        seed=seed,
    )


def _hf_config(config, **extra):
    _, transformers = _torch()
    return transformers.ModernBertConfig(
        **config.to_hf_dict(), attn_implementation="eager", **extra
    )


def _hf_model(cls_name, config, seed=0, **extra):
    """A transformers model with every parameter random: its own init zeroes biases and sets
    norms to one, which would hide a swapped bias or scale."""
    _, transformers = _torch()
    model = getattr(transformers, cls_name)(_hf_config(config, **extra))
    # Imported here: torch is for the parity tier, and the unit tier imports this module.
    from tests.helpers.torch_params import randomize_torch

    return randomize_torch(model, seed, 0.2)


def _state_dict(model):
    return {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}


def _run_torch(model, ids, mask, **kwargs):
    torch, _ = _torch()
    with torch.no_grad():
        return model(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            **kwargs,
        )


@functools.partial(jax.jit, static_argnums=(0,))
def _apply(module, params, *args, **kwargs):
    """`module.apply` compiled as one program (run op by op, each operation compiles its
    own); array arguments stay arguments, the others are fixed in the program."""
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, (np.ndarray, jax.Array))}
    fixed = {k: v for k, v in kwargs.items() if k not in arrays}

    def run(params, args, arrays):
        return module.apply({"params": params}, *args, **arrays, **fixed)

    return jax.jit(run)(params, args, arrays)
