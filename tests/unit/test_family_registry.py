"""A config names its family; fine-tuning's model fields are checked by that family; one mean
pooling serves every caller."""

import dataclasses
from typing import ClassVar

import numpy as np
import pytest

from bertjax import encoders
from bertjax.encoders import family as family_lib
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine.settings import ConfigError
from bertjax.finetune.settings import FinetuneSettings
from bertjax.nn import pooling
from configs import finetune as finetune_config

TINY = dict(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


@dataclasses.dataclass(frozen=True)
class _ElectraNamedBert(BertConfig):
    """A BertConfig subclass that names another family: the name wins, not the class tree."""

    family: ClassVar[str] = "electra"


@dataclasses.dataclass(frozen=True)
class _Unregistered(BertConfig):
    family: ClassVar[str] = "nobody"


def test_family_of_reads_the_name_a_config_class_gives():
    assert encoders.family_of(BertConfig(**TINY)).name == "bert"
    assert encoders.family_of(ModernBertConfig.preset("tiny")).name == "modernbert"
    assert encoders.family_of(ElectraConfig.preset("small")).name == "electra"
    assert encoders.family_of(_ElectraNamedBert(**TINY)).name == "electra"
    with pytest.raises(ValueError, match="_Unregistered is no encoder family's config"):
        encoders.family_of(_Unregistered(**TINY))
    # The name is a class attribute, not a field: checkpoint meta is unchanged.
    assert "family" not in BertConfig(**TINY).to_dict()
    assert encoders.config_to_dict(BertConfig(**TINY))["family"] == "bert"


def test_a_family_must_be_named_by_its_config_class():
    class Mismatched(family_lib.EncoderFamily):
        name = "mismatched"
        config_class = BertConfig

    with pytest.raises(ValueError, match="BertConfig.family must name its family 'mismatched'"):
        family_lib.register(Mismatched())
    assert "mismatched" not in encoders.names()


def test_a_family_must_hold_its_modules_and_transformers_functions():
    bert = encoders.get("bert")

    class Partial(family_lib.EncoderFamily):
        name = "partial"
        config_class = dataclasses.make_dataclass(
            "PartialConfig", [], bases=(BertConfig,), frozen=True, namespace={"family": "partial"}
        )
        module = bert.module
        pretraining_model = bert.pretraining_model

    with pytest.raises(ValueError, match=r"'partial' holds no \['pretraining_init', "):
        family_lib.register(Partial())
    assert "partial" not in encoders.names()


def _settings(tmp_path, **model) -> FinetuneSettings:
    config = finetune_config.get_config()
    config.init_from = str(tmp_path)
    config.task = "classification"
    config.data.train = str(tmp_path / "train.csv")
    config.data.validation = str(tmp_path / "train.csv")
    config.batch_size = 8
    config.eval_batch_size = 8
    for key, value in model.items():
        config.model[key] = value
    return FinetuneSettings.from_config(config)


@pytest.mark.parametrize(
    "checkpoint",
    [
        BertConfig(**TINY),
        ModernBertConfig.preset("tiny", pad_token_id=0, cls_token_id=0, dtype="float32"),
        ElectraConfig.preset("tiny"),
    ],
    ids=["bert", "modernbert", "electra"],
)
def test_finetune_model_fields_are_checked_by_the_checkpoints_family(tmp_path, checkpoint):
    (tmp_path / "train.csv").write_text("sentence,label\na,0\n")
    good = _settings(tmp_path, hidden_dropout=0.2, matmul_dtype="bfloat16")
    good = good.model_config(checkpoint)
    assert encoders.family_of(good) is encoders.family_of(checkpoint)
    assert good.matmul_dtype == "bfloat16" and good.dtype == "float32"
    assert _settings(tmp_path).model_config(checkpoint).matmul_dtype is None
    bad = _settings(tmp_path, hidden_dropout=1.5)  # read without a family: accepted here
    with pytest.raises(ConfigError, match=r"^config\.model: .*1\.5"):
        bad.model_config(checkpoint)
    bad = _settings(tmp_path, matmul_dtype="int8")
    with pytest.raises(ConfigError, match=r"^config\.model: .*matmul_dtype='int8'"):
        bad.model_config(checkpoint)


def test_mean_pooling_averages_the_marked_tokens_and_zeroes_empty_rows():
    rng = np.random.default_rng(0)
    sequence = rng.normal(size=(3, 5, 4)).astype(np.float32)  # [b, s, h]
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])  # [b, s]
    pooled = np.asarray(pooling.mean(sequence, mask))
    np.testing.assert_allclose(pooled[0], sequence[0, :3].mean(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(pooled[1], sequence[1, 0])
    np.testing.assert_array_equal(pooled[2], np.zeros(4, np.float32))
