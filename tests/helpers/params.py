"""Random parameters for parity and conversion tests: every leaf drawn, so that no bias is
zero and no LayerNorm scale one (an initialisation that leaves them so would hide a tensor
mapped to the wrong place or transposed)."""

import math
from typing import Any

import jax
import numpy as np
from flax import linen as nn


def random_like(abstract, seed: int, std: float = 0.2):
    """`abstract`'s tree (shapes, e.g. from jax.eval_shape; boxed or not) filled with
    normal(0, std) noise as float32 numpy arrays, 1 + noise for LayerNorm scales. Boxed
    leaves (nn.Partitioned) keep their boxes and sharding names."""
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.normal(0, std, leaf.shape).astype(np.float32)
        return 1.0 + noise if path[-1].key == "scale" else noise

    def fill_boxed(path, leaf):
        if isinstance(leaf, nn.Partitioned):
            return leaf.replace(value=fill(path, leaf.value))
        return fill(path, leaf)

    return jax.tree.map_with_path(
        fill_boxed, abstract, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )


def random_init(init, seed: int, std: float = 0.2):
    """Random parameters (random_like) in the tree that `init()` builds, traced for its shapes
    only, unboxed."""
    return random_like(nn.meta.unbox(jax.eval_shape(init)), seed, std)


def random_init_from_key(init, seed: int, std: float = 0.2):
    """random_init for an init that takes a random key (`init(key) -> params`)."""
    return random_init(lambda: init(jax.random.key(seed)), seed, std)


def max_diff(a, b, rows=None) -> float:
    """The largest absolute difference of two arrays, in float64 (over `rows` only if given)."""
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(diff[rows].max() if rows is not None else diff.max())


def count_params(params: Any) -> int:
    """Number of scalars in a (boxed or unboxed, concrete or abstract) params tree."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(params)))
