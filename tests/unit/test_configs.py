"""Every recipe in configs/ reads as the command it documents would read it."""

import importlib
import pathlib

import jax
import pytest

from bertjax.engine.settings import ConfigError
from bertjax.pretrain.settings import PretrainSettings

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
# Recipes read by other commands (finetune.py, evaluate.py) and the shared recipe module.
NOT_PRETRAINING = {"finetune", "glue", "glue_modernbert", "modern_recipe", "default"}
# Recipes that continue another run: they refuse to start without it.
CONTINUING = {"base_phase2", "modernbert_base_context", "modernbert_tiny_context"}
# Recipes that learn from a teacher run: they refuse to start until it exists.
DISTILLING = {"distil_base", "distil_tiny"}
RECIPES = sorted(p.stem for p in CONFIGS.glob("*.py") if p.stem != "__init__")


# The bases every recipe starts from: no command of their own.
BASES = {"default", "modern_recipe"}


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in BASES])
def test_a_recipe_documents_its_command(name):
    doc = importlib.import_module(f"configs.{name}").__doc__ or ""
    # finetune.py's own default needs no --config.
    command = "python finetune.py" if name == "finetune" else f"configs/{name}.py"
    assert "python " in doc and command in doc, f"configs/{name}.py"


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in NOT_PRETRAINING])
def test_a_pretraining_recipe_passes_the_settings_checks(name, tmp_path, monkeypatch):
    # The recipes name runs relative to where the command starts (distil_tiny's teacher is
    # runs/tiny); read from an empty directory, not from a clone where the README's first
    # command has already written runs/tiny.
    monkeypatch.chdir(tmp_path)
    config = importlib.import_module(f"configs.{name}").get_config()
    if name in CONTINUING:
        with pytest.raises(ConfigError, match="init_from"):
            PretrainSettings.from_config(config, devices=jax.devices())
        return
    if name in DISTILLING:
        config.teacher = config.teacher or "runs/no_such_teacher"
        with pytest.raises(ConfigError, match="config.teacher=.*no such directory"):
            PretrainSettings.from_config(config, devices=jax.devices())
        return
    settings = PretrainSettings.from_config(config, devices=jax.devices())
    assert settings.objective == config.objective
