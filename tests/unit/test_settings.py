"""Settings: the config is read once, each mistake fails in one line naming the field."""

import types

import pytest
from flax import linen as nn

from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine import settings as settings_lib
from bertjax.engine.settings import ConfigError
from bertjax.nn import sharding
from bertjax.pretrain.settings import PretrainSettings
from configs import default, modernbert_tiny, tiny
from tests.helpers.xla_env import REPO


def _tokenizer(vocab_size: int):
    """What model_config reads of a tokenizer: its size and special ids."""
    return types.SimpleNamespace(vocab_size=vocab_size, pad_id=0, cls_id=2, sep_id=3)


def test_settings_are_typed_and_frozen():
    config = tiny.get_config()
    settings = PretrainSettings.from_config(config)
    assert settings.model.num_layers == 2 and settings.model.hidden_size == 128
    assert settings.data.masking.max_predictions_per_seq == config.data.max_predictions_per_seq
    assert settings.optimizer.total_steps == config.num_train_steps
    assert settings.run.micro_batch_size == config.batch_size // config.grad_accum_steps
    assert settings.data.inputs == ()
    with pytest.raises(AttributeError):
        settings.run.batch_size = 1  # frozen
    # The tokenizer's vocabulary completes the architecture.
    assert settings.model_config(_tokenizer(1234)).vocab_size == 1234


def test_a_modernbert_config_takes_the_tokenizers_vocabulary_and_special_ids():
    settings = PretrainSettings.from_config(modernbert_tiny.get_config())
    assert isinstance(settings.model, ModernBertConfig)
    assert settings.model.hidden_size == 128 and settings.model.local_attention == 64
    # hidden_dropout is read as ModernBERT's embedding and feed-forward dropout.
    assert settings.model.embedding_dropout == settings.model.mlp_dropout == 0.0
    model = settings.model_config(_tokenizer(321))
    assert (model.vocab_size, model.pad_token_id, model.cls_token_id, model.sep_token_id) == (
        321,
        0,
        2,
        3,
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("model.family", "albert", r"config\.model: encoder family 'albert' is unknown"),
        ("objective", "mlm_sentence", r"config\.objective=.*has not; set objective='mlm'"),
    ],
)
def test_a_modernbert_config_refuses_what_the_family_cannot_do(field, value, message):
    config = modernbert_tiny.get_config()
    section, _, name = field.rpartition(".")
    (config[section] if section else config)[name] = value
    if value == "mlm_sentence":
        config.data.layout = "pairs"  # the packed layout is refused for that reason first
    with pytest.raises(ConfigError, match=message):
        PretrainSettings.from_config(config)


@pytest.mark.parametrize("field", ["masked_lm_prob", "eval_masked_lm_prob"])
def test_a_prediction_cap_below_the_masking_rate_is_refused(field):
    config = tiny.get_config()  # rows of 128, at most 20 predictions
    config.data[field] = 0.3  # 38 of a full row
    with pytest.raises(ConfigError) as error:
        PretrainSettings.from_config(config)
    assert "config.data.max_predictions_per_seq=20" in str(error.value)
    assert f"data.{field}=0.3 (38 of them); raise it to at least 38" in str(error.value)
    config.data.max_predictions_per_seq = 38
    PretrainSettings.from_config(config)


def test_comma_separated_inputs_become_a_tuple(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("x\n")
    config = tiny.get_config()
    config.data.input = f" {tmp_path / 'a.txt'} , {tmp_path / 'b.txt'},"
    assert PretrainSettings.from_config(config).data.inputs == (
        str(tmp_path / "a.txt"),
        str(tmp_path / "b.txt"),
    )


def test_a_vocabulary_that_the_tokenizer_does_not_have_is_named():
    config = tiny.get_config()
    config.model.vocab_size = 123
    settings = PretrainSettings.from_config(config)
    with pytest.raises(ConfigError, match=r"config\.model\.vocab_size=123 .* 4000"):
        settings.model_config(_tokenizer(4000))


@pytest.mark.parametrize(
    "mesh_shape, model, dimension, axis",
    [
        ((1, 1, 8), {}, "model.num_heads=2", "tensor"),  # tiny has 2 heads
        ((1, 8, 1), {"hidden_size": 36, "num_heads": 2}, "model.hidden_size=36", "fsdp"),
        (
            (1, 1, 8),
            {"num_heads": 8, "intermediate_size": 100},
            "model.intermediate_size=100",
            "tensor",
        ),
    ],
)
def test_a_mesh_that_does_not_divide_the_model_fails_naming_both(
    mesh_shape, model, dimension, axis
):
    config = tiny.get_config()
    config.mesh_shape = mesh_shape
    config.batch_size = 64
    for key, value in model.items():
        config.model[key] = value
    with pytest.raises(ConfigError, match=rf"config\.mesh_shape=.*{dimension}.*'{axis}'"):
        PretrainSettings.from_config(config)


def test_a_sharded_vocabulary_is_checked_when_the_tokenizer_is_known():
    config = tiny.get_config()
    settings = PretrainSettings.from_config(config)
    mesh = sharding.make_mesh((4, 2, 1))
    settings_lib.check_mesh_fits(
        settings.model_config(_tokenizer(4000)), mesh
    )  # vocab is not sharded
    # Were the vocabulary sharded over fsdp, an odd size would be named.
    rules = ((sharding.VOCAB, sharding.FSDP), *sharding.LOGICAL_RULES)
    with nn.logical_axis_rules(rules):
        with pytest.raises(ConfigError, match=r"model\.vocab_size=4001"):
            settings_lib.check_mesh_fits(settings.model_config(_tokenizer(4001)), mesh)


def test_misspelt_fields_get_a_suggestion():
    config = default.get_config()
    assert settings_lib.suggest_field(config, "optimizer.learnig_rate") == "optimizer.learning_rate"
    assert settings_lib.suggest_field(config, "data.max_seq_len") == "data.max_seq_length"
    assert settings_lib.suggest_field(config, "zzz") is None


def test_no_module_below_the_settings_takes_a_config_dict():
    readers = [
        path.relative_to(REPO).as_posix()
        for path in (REPO / "bertjax").rglob("*.py")
        if "ConfigDict" in path.read_text()
    ]
    assert sorted(readers) == [
        "bertjax/engine/settings.py",
        "bertjax/finetune/settings.py",
        "bertjax/glue/settings.py",
        "bertjax/pretrain/settings.py",
    ]
