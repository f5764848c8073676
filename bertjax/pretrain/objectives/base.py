"""What a pretraining objective is to a run, and the registry that lists them.

An objective owns everything of a pretraining run that depends on what a step minimises:

  check, read  its settings checks (the data's layout, the family's heads, its own fields)
               and its own typed settings (PretrainSettings.objective_settings), read from
               a config (`values`, `options`) when a run starts and when it opens
  masking      how the loader masks its batches
  frozen       the parameters the optimizer leaves untouched (heads it does not train)
  model_init   the parameter tree it trains: `rng -> boxed parameters`
  step         the engine's `steps.Loss` (loss sums, denominators, loss, metrics)
  baselines    what a model that learned nothing scores on its eval metrics
  cautions     warnings its eval metrics call for (logged at each evaluation)
  flops        matmul FLOPs of training on one sequence (perf's MFU)
  samples      the lines shown at the end of a run
  run_meta     what its checkpoints record beyond the run's settings (for opening them)
  tokenizer_from  the tokenizer its data is read with when data.tokenizer is unset (a
               teacher's)
  batch_features  what a frozen network computes from each batch on the devices, added to
               the batch (a teacher's outputs: bertjax.engine.teacher)
  initial_params  values the trained parameters start from instead of a random init (a
               student made of its teacher's layers)
  networks     how a run it trained opens: the networks in its parameters, each a model of
               its family ("" the one fine-tuning and exports take), and the notebook
               methods they serve (bertjax.engine.networks.PretrainedRuns, which the run
               directory and Model ask, below this package)

bertjax.pretrain.objectives lists the registered objectives in one tuple; the settings, the
loop, the warm start and the run directory ask `get(name)` (or engine.networks) and never
branch on a name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax

from bertjax.data.masking import MaskingSettings
from bertjax.engine import networks, steps
from bertjax.engine.settings import fail

# Where a checkpoint's meta keeps what the objective records (`run_meta`).
RUN_META_KEY = "objective_meta"


class PretrainObjective(networks.PretrainedRuns):
    """One pretraining objective (see the module docstring); `name` is config.objective."""

    name: str = ""
    # Whether the objective trains (and evaluation reports) the sentence-pair task.
    sentence_pair: bool = False
    # The summary's heading above the lines of `samples`.
    samples_title: str = ""
    # The objective's own config fields (config.<name>) and their defaults when a config
    # lacks them.
    fields: Mapping[str, Any] = {}

    def check(self, values: Mapping[str, Any], family: Any, layout: str) -> None:
        """Fails with a ConfigError naming the field when the config cannot run this objective.

        `values` holds config.objective and the objective's own `fields` as the config gives
        them; `family` is the run's encoder family, `layout` its data.layout."""

    def read(self, values: Mapping[str, Any]) -> Any:
        """The objective's own settings from its checked `values`, or None."""
        return None

    def values(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """config.objective and the objective's own `fields` as a run's config (settings, or
        a checkpoint's recorded "config") gives them, defaults where it lacks them (configs
        written before the field)."""
        values = {"objective": self.name}
        values.update({name: config.get(name, default) for name, default in self.fields.items()})
        return values

    def options(self, config: Mapping[str, Any]) -> Any:
        """The objective's own settings (`read`) of a run's recorded config."""
        return self.read(self.values(config))

    def masking(self, masking: MaskingSettings, max_seq_length: int) -> MaskingSettings:
        """The loader's masking for this objective (the config's, unless it has its own)."""
        return masking

    def frozen(self, family: Any, model_config: Any, options: Any = None) -> tuple[str, ...]:
        """Parameter path prefixes the optimizer leaves untouched (options: its `read`)."""
        return ()

    def model_init(
        self, family: Any, model_config: Any, options: Any = None
    ) -> Callable[[jax.Array], Any]:
        """`rng -> boxed parameters` of what the run trains (options: its `read`)."""
        return family.pretraining_init(model_config)

    def step(self, family: Any, model_config: Any, settings: Any) -> steps.Loss:
        """What a step minimises (settings: the run's PretrainSettings)."""
        raise NotImplementedError

    def baselines(
        self, settings: Any, data_dir: str | os.PathLike, eval_metrics: dict | None = None
    ) -> dict[str, float]:
        """Eval metrics of a model that learned nothing, keyed as the eval metrics are
        (`eval_metrics`: the run's last, for baselines measured beside them)."""
        return {}

    def cautions(self, eval_metrics: Mapping[str, float]) -> list[str]:
        """One line per problem the eval metrics show (logged as a warning at each
        evaluation); none by default."""
        return []

    def flops(
        self, family: Any, model_config: Any, seq_len: int, predictions: int, options: Any = None
    ) -> float:
        """Matmul FLOPs to train on one sequence."""
        raise NotImplementedError

    def samples(
        self,
        model_config: Any,
        params: Any,
        tokenizer: Any,
        data_dir: str | os.PathLike,
        count: int,
        mesh: jax.sharding.Mesh,
        options: Any = None,
    ) -> list[str]:
        """Printable lines on held-out text shown at the end of a run (options: its
        `read`)."""
        return []

    def tokenizer_from(self, options: Any) -> Any:
        """The tokenizer a run reads its data with where data.tokenizer (and init_from) give
        none, or None: one trained on the data."""
        return None

    def batch_features(
        self, model_config: Any, options: Any, tokenizer: Any, built: steps.Steps
    ) -> Callable | None:
        """`(global batch) -> {feature: array}` a frozen network adds to every training and
        evaluation batch on the devices (steps.Steps.batch_features), or None."""
        return None

    def initial_params(self, model_config: Any, options: Any, abstract_params: Any) -> Any:
        """Values the trained parameters start from, placed as `abstract_params` (their
        shapes and shardings) says, or None: `model_init`'s random ones."""
        return None

    def run_meta(self, model_config: Any, options: Any = None) -> dict[str, Any]:
        """JSON its checkpoints record beyond the run's settings, for `networks` to open them
        (under RUN_META_KEY in their meta), e.g. a frozen teacher's config; none by default."""
        return {}


def require(values: Mapping[str, Any], ok: bool, field: str, message: str) -> None:
    """Fails naming config.<field> and its value unless `ok`."""
    if not ok:
        raise fail(field, values[field], message)


_OBJECTIVES: dict[str, PretrainObjective] = {}


def register(objective: PretrainObjective) -> PretrainObjective:
    """Adds an objective (bertjax.pretrain.objectives does, for each one it lists)."""
    if _OBJECTIVES.get(objective.name, objective) is not objective:
        raise ValueError(f"pretraining objective {objective.name!r} is registered twice")
    _OBJECTIVES[objective.name] = objective
    # The run directory and Model open its runs through it.
    networks.register(objective)
    return objective


def names() -> tuple[str, ...]:
    return tuple(_OBJECTIVES)


def get(name: str) -> PretrainObjective:
    """The objective of a name (config.objective)."""
    if name not in _OBJECTIVES:
        raise ValueError(f"objective {name!r} is unknown: valid objectives are {names()}")
    return _OBJECTIVES[name]
