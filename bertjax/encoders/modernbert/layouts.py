"""The two layouts of a ModernBERT encoder's params: plain (layer_0 .. layer_{L-1}) and scanned
(layer_0, the groups stacked under "groups" with a leading [groups] axis, the tail layers), as
`config.scan_layers` builds the model (bertjax.encoders.modernbert.model.LayerGroup)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.encoders.modernbert.model import GROUPS, group_layout


def stack_layers(encoder: Mapping[str, Any], config: ModernBertConfig) -> dict:
    """ModernBertModel params, plain layout -> scanned layout (unboxed arrays)."""
    groups, _ = group_layout(config)
    n = config.global_attn_every_n_layers
    grouped = {f"layer_{1 + g * n + j}" for g in range(groups) for j in range(n)}
    missing = sorted(grouped - set(encoder))
    if missing:
        raise ValueError(f"encoder params have no {missing[0]!r}: expected the plain layout")
    out = {key: value for key, value in encoder.items() if key not in grouped}
    if groups:
        out[GROUPS] = {
            f"layer_{j}": jax.tree.map(
                lambda *xs: jnp.stack(xs),  # [groups, ...]
                *[encoder[f"layer_{1 + g * n + j}"] for g in range(groups)],
            )
            for j in range(n)
        }
    return out


def unstack_layers(encoder: Mapping[str, Any], config: ModernBertConfig) -> dict:
    """ModernBertModel params, scanned layout -> plain layout (unboxed arrays)."""
    groups, _ = group_layout(config)
    n = config.global_attn_every_n_layers
    out = {key: value for key, value in encoder.items() if key != GROUPS}
    if not groups:
        return out
    if GROUPS not in encoder:
        raise ValueError(f"encoder params have no {GROUPS!r}: expected the scanned layout")
    for j in range(n):
        stacked = encoder[GROUPS][f"layer_{j}"]
        for leaf in jax.tree.leaves(stacked):
            if np.shape(leaf)[0] != groups:
                raise ValueError(
                    f"stacked layers have {np.shape(leaf)[0]} groups, the config {groups}"
                )
        for g in range(groups):
            out[f"layer_{1 + g * n + j}"] = jax.tree.map(lambda x, g=g: x[g], stacked)
    return out
