"""How a pretraining run's networks open (bertjax.engine.networks): as its objective registered
them, or as its family's model when the objective registered none; a tree as its family's
model, what it lacks of the family's tree freshly made and named; the encoder's layers only
its pooled output reads; what an objective records in its checkpoints to open them."""

import types

import jax
import numpy as np
import pytest
from flax import linen as nn

from bertjax import encoders
from bertjax.engine import networks
from bertjax.pretrain import objectives
from bertjax.pretrain.loop import _Hooks
from bertjax.pretrain.objectives.rtd.replaced import replaced
from tests.helpers.encoders import SMALL_CONFIGS


def _tree(config):
    """The family's pretraining tree of `config`, as its init makes it (key 0)."""
    init = encoders.family_of(config).pretraining_init(config)
    return nn.meta.unbox(jax.jit(init)(jax.random.key(0)))


def test_the_pooled_output_layers_are_each_familys_pooler_group():
    assert networks.pooled_output_layers(SMALL_CONFIGS["bert"]) == ("bert/pooler",)
    assert networks.pooled_output_layers(SMALL_CONFIGS["electra"]) == ("bert/pooler",)
    # ModernBERT's prediction head: its dense layer and norm, one subtree.
    assert networks.pooled_output_layers(SMALL_CONFIGS["modernbert"]) == ("bert/head",)


def test_a_tree_opens_as_its_familys_model_with_what_it_lacks_made_fresh():
    config = SMALL_CONFIGS["electra"]
    whole = _tree(config)
    network = networks.family_model(config, whole)
    assert network.params is whole and network.fresh == ()
    lacking = {name: group for name, group in whole.items() if name != "mlm_head"}
    network = networks.family_model(config, lacking, untrained=("pooler",))
    # Named by the family's tensor map, made as its init makes them.
    assert network.fresh == ("mlm_head", "pooler")
    for made, init in zip(jax.tree.leaves(network.params), jax.tree.leaves(whole)):
        np.testing.assert_array_equal(made, init)
    # ModernBERT's decoder bias is its masked-LM head's group.
    config = SMALL_CONFIGS["modernbert"]
    lacking = {name: group for name, group in _tree(config).items() if name != "decoder_bias"}
    assert networks.family_model(config, lacking).fresh == ("mlm_head",)


def test_a_tree_of_other_shapes_than_its_config_is_refused():
    config = SMALL_CONFIGS["electra"]
    whole = _tree(config)
    bad = {**whole, "mlm_head": {**whole["mlm_head"], "output_bias": np.zeros(3, np.float32)}}
    with pytest.raises(ValueError, match=r"mlm_head/output_bias has shape \(3,\), but ELECTRA"):
        networks.family_model(config, bad)


def test_a_run_opens_as_its_objective_registered_it(monkeypatch):
    config = SMALL_CONFIGS["bert"]
    params = {"bert": 1, "twin": 2}
    alone = {"": networks.Network(config, params)}
    assert networks.of_run(config, params, {"config": {"objective": "mlm_sentence"}}) == alone
    assert networks.of_run(config, params, {}) == alone  # no objective recorded

    class Twin(networks.PretrainedRuns):
        name = "twin"
        notebook = {"twins": lambda model: "served"}

        def networks(self, config, params, meta):
            return {
                "": networks.Network(config, params["bert"]),
                "twin": networks.Network(config, params["twin"], meta["objective_meta"]["fresh"]),
            }

    monkeypatch.setattr(networks, "_RUNS", dict(networks._RUNS))
    networks.register(Twin())
    meta = {"config": {"objective": "twin"}, "objective_meta": {"fresh": ("pooler",)}}
    opened = networks.of_run(config, params, meta)
    assert opened["twin"] == networks.Network(config, 2, ("pooler",)) and opened[""].params == 1
    assert networks.method("twins")(None) == "served"
    assert networks.method("replaced") is replaced
    with pytest.raises(ValueError, match=r"no pretraining objective serves nothing\(\)"):
        networks.method("nothing")
    with pytest.raises(ValueError, match="'twin' are registered twice"):
        networks.register(Twin())


def test_a_checkpoint_records_what_its_objective_needs_to_open_it(monkeypatch):
    objective = objectives.get("mlm")
    hooks = _Hooks(
        settings=types.SimpleNamespace(
            objective="mlm", objective_settings=None, config={"objective": "mlm"}
        ),
        model_config=SMALL_CONFIGS["bert"],
        run=None,
        tokenizer=types.SimpleNamespace(fingerprint="f"),
        train_loader=types.SimpleNamespace(get_state=dict),
        eval_batches=list,
        checkpoint_dir=None,
        dropout_rng=jax.random.key(0),
    )
    assert objectives.RUN_META_KEY not in hooks.meta(1)
    monkeypatch.setattr(objective, "run_meta", lambda config, options: {"teacher": "t"})
    assert hooks.meta(1)[objectives.RUN_META_KEY] == {"teacher": "t"}
