"""An RTD model's two networks in transformers: written as Model.save_hf writes a run's networks
(as the rtd objective opens them, each in its directory), the discriminator opens as
ElectraForPreTraining and the generator as ElectraForMaskedLM, nothing missing or unexpected,
with the logits of bertjax's networks (random weights, within 1e-5)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from bertjax import encoders
from bertjax.pretrain import objectives
from bertjax.pretrain.objectives.rtd import model as rtd_model
from tests.helpers.encoders import SMALL_CONFIGS
from tests.helpers.params import random_init_from_key

ATOL = 1e-5
CONFIG = dataclasses.replace(
    SMALL_CONFIGS["electra"],
    vocab_size=60,
    intermediate_size=48,
    max_position_embeddings=24,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def test_both_networks_open_in_transformers_with_the_same_logits(tmp_path):
    # Every leaf random (LayerNorms and biases too), so a misplaced tensor shows.
    params = random_init_from_key(rtd_model.init(CONFIG, 0.5), seed=1)
    family = encoders.family_of(CONFIG)
    meta = {"config": {"objective": "rtd", "generator_hidden_fraction": 0.5}}
    networks = objectives.get("rtd").networks(CONFIG, params, meta)
    assert set(networks) == {"", rtd_model.GENERATOR}
    for name, network in networks.items():
        family.write_transformers(
            network.config, network.params, tmp_path / name, untrained=network.fresh
        )

    rng = np.random.default_rng(0)
    ids = rng.integers(5, CONFIG.vocab_size, (2, 10)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    model = rtd_model.ReplacedTokenDetection(CONFIG, 0.5)
    # Each network's logits as one compiled program: op by op, every operation compiles alone.
    replaced_logits = jax.jit(
        functools.partial(model.apply, method=rtd_model.ReplacedTokenDetection.replaced_logits)
    )
    ours = replaced_logits({"params": params}, ids, None, mask)
    loaded, info = transformers.ElectraForPreTraining.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        theirs = loaded(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours)[mask > 0], theirs[mask > 0], atol=ATOL)

    positions = jnp.broadcast_to(jnp.arange(10), ids.shape)  # every position
    generator_logits = jax.jit(
        functools.partial(
            model.apply,
            deterministic=True,
            method=rtd_model.ReplacedTokenDetection.generator_logits,
        )
    )
    ours = generator_logits({"params": params}, ids, None, mask, positions)
    loaded, info = transformers.ElectraForMaskedLM.from_pretrained(
        tmp_path / rtd_model.GENERATOR, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.config.hidden_size == 16 and loaded.config.embedding_size == 16
    with torch.no_grad():
        theirs = loaded(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours)[mask > 0], theirs[mask > 0], atol=ATOL)
