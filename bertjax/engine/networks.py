"""The networks a pretraining run trained, each a model of its family, and the registry
through which each pretraining objective says how its runs open.

A pretraining run trains its family's pretraining model, or more: replaced-token detection
trains a generator beside its discriminator; a distillation would train a student beside a
frozen teacher. The run directory (`rundir.read_networks`) opens a pretraining run's
checkpoint as networks by name: "" the one that fine-tuning's init_from starts from, that
`Model.load` opens and `save_hf` exports, and any other under its own name
(`Model.networks`). How a trained tree splits into networks is its objective's: each
objective is a `PretrainedRuns` (bertjax.pretrain.objectives.base.PretrainObjective is one),
registered here by bertjax.pretrain.objectives, which `import bertjax` imports so that a
fresh process opens every kind of run. A run whose objective registered nothing opens as its
family's model. The notebook methods an objective's networks serve (replaced-token
detection's `Model.replaced`) are found here too.

What every objective's networks share: `family_model` opens a tree as its family's
pretraining model (the parameters it lacks freshly made, their groups named), and
`pooled_output_layers` names the encoder's layers only its pooled output reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np

from bertjax import capability, encoders
from bertjax.storage import hf


class Network(NamedTuple):
    """One network a pretraining run trained, as a model of its family: its config, the
    family's pretraining tree of it, and the groups of that tree the run did not train
    (freshly made, so the tree is whole; inference refuses what needs them)."""

    config: Any
    params: Any
    fresh: tuple[str, ...] = ()


class PretrainedRuns:
    """How the runs of one pretraining objective open (its `name` is config.objective).

    Members:
      notebook   method name -> function(model, *args): the Model methods its networks serve
                 (Model forwards to them), e.g. "replaced"
    """

    name: str = ""
    notebook: Mapping[str, Callable[..., Any]] = {}

    def networks(self, config: Any, params: Any, meta: Mapping[str, Any]) -> dict[str, Network]:
        """The networks of a run's trained parameters, by name ("" the family model its
        family's code opens), given its family model's `config` and the checkpoint's `meta`
        (its "config": the run's settings, as the objective's own fields read them)."""
        return {"": Network(config, params)}


_RUNS: dict[str, PretrainedRuns] = {}


def register(runs: PretrainedRuns) -> PretrainedRuns:
    """Adds an objective's runs (bertjax.pretrain.objectives does, for each objective)."""
    if _RUNS.get(runs.name, runs) is not runs:
        raise ValueError(f"the runs of objective {runs.name!r} are registered twice")
    _RUNS[runs.name] = runs
    return runs


def of_run(config: Any, params: Any, meta: Mapping[str, Any]) -> dict[str, Network]:
    """The networks of a pretraining run's parameters, as its objective (the checkpoint's
    config.objective) opens them; the family model alone for an objective that registered
    nothing."""
    objective = (meta.get("config") or {}).get("objective")
    if objective not in _RUNS:
        return {"": Network(config, params)}
    return _RUNS[objective].networks(config, params, meta)


def method(name: str) -> Callable[..., Any]:
    """The function some objective's networks serve as Model method `name`."""
    for runs in _RUNS.values():
        if name in runs.notebook:
            return runs.notebook[name]
    raise ValueError(f"no pretraining objective serves {name}(); registered: {tuple(_RUNS)}")


def family_model(config: Any, params: Any, untrained: Sequence[str] = ()) -> Network:
    """`params` as its family's pretraining model of `config`: the parameters of that tree it
    lacks made as the family's init makes them, and those groups (named by the family's
    tensor map) and the `untrained` ones reported fresh. Groups beyond the family's tree (a
    replaced-token head) stay; a parameter of another shape than `config` gives fails."""
    family = encoders.family_of(config)
    abstract = jax.eval_shape(family.pretraining_init(config), jax.random.key(0))
    shapes = {path: leaf.shape for path, leaf in hf.flatten_tree(nn.meta.unbox(abstract))}
    flat = dict(hf.flatten_tree(params))
    for path, shape in shapes.items():
        if path in flat and tuple(np.shape(flat[path])) != tuple(shape):
            raise ValueError(
                f"params: {'/'.join(path)} has shape {tuple(np.shape(flat[path]))}, but "
                f"{family.describe(config)} gives {tuple(shape)}"
            )
    missing = tuple(path for path in shapes if path not in flat)
    if not missing:
        return Network(config, params, tuple(sorted(set(untrained))))
    groups = {spec.path: spec.group for spec in family.pretraining_tensors(config)}
    dtype = np.dtype(config.param_dtype)
    for path, value in zip(missing, _fresh_values(config, missing)):
        flat[path] = np.asarray(value).astype(dtype)
    fresh = {*untrained, *(groups.get(path, path[0]) for path in missing)}
    return Network(config, hf.unflatten_tree(flat), tuple(sorted(fresh)))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _fresh_values(config: Any, paths: tuple[tuple[str, ...], ...]) -> list[jax.Array]:
    # Returning only the selected leaves lets XLA drop the rest of the init.
    init = encoders.family_of(config).pretraining_init(config)
    params = nn.meta.unbox(init(jax.random.key(0)))
    return [hf._get(params, path) for path in paths]


def pooled_output_layers(config: Any) -> tuple[str, ...]:
    """Path prefixes ("bert/pooler") of the encoder's layers that only its pooled output
    reads: the family's POOLER group in its pretraining tree (BERT's and ELECTRA's pooler,
    ModernBERT's prediction head), each prefix the largest subtree that holds nothing else.
    What a network that reads the encoder's hidden states alone never trains."""
    specs = [
        spec
        for spec in encoders.family_of(config).pretraining_tensors(config)
        if spec.path[0] == capability.ENCODER
    ]

    def pooled_only(prefix: tuple[str, ...]) -> bool:
        return all(s.group == hf.POOLER for s in specs if s.path[: len(prefix)] == prefix)

    prefixes: list[str] = []
    for spec in specs:
        if spec.group != hf.POOLER:
            continue
        prefix = spec.path[:-1]  # the layer
        while len(prefix) > 1 and pooled_only(prefix[:-1]):
            prefix = prefix[:-1]
        if "/".join(prefix) not in prefixes:
            prefixes.append("/".join(prefix))
    return tuple(prefixes)
