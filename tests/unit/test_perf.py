"""FLOP counting against a hand count and the model's own matmuls; peak table lookup."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.engine import perf
from tests.helpers.encoders import SMALL_BERT


def test_bert_base_flops_match_hand_count():
    # BERT-base, S=128, P=20. Per token per layer: QKVO 8*768^2 = 4,718,592;
    # FFN 4*768*3072 = 9,437,184; attention 4*128*768 = 393,216; sum 14,548,992.
    # Encoder: 128 * 12 * 14,548,992 = 22,347,251,712. Pooler + NSP: 1,179,648 + 3,072.
    # MLM: 20 * (1,179,648 + 46,881,792) = 961,228,800. Forward 23,309,663,232; x3.
    config = BertConfig()
    assert perf.training_flops_per_sequence(config, 128, 20) == 69_928_989_696


def test_flops_proportionality():
    config = BertConfig.preset("small")
    f = perf.training_flops_per_sequence
    h, v = config.hidden_size, config.vocab_size
    # Layers add equal encoder costs; what is left is the pooler, NSP and MLM heads.
    one, two, three = (
        f(dataclasses.replace(config, num_layers=k * config.num_layers), 128, 20) for k in (1, 2, 3)
    )
    assert three - two == pytest.approx(two - one)
    heads = 2 * h * h + 4 * h + 20 * (2 * h * h + 2 * h * v)
    assert one - (two - one) == pytest.approx(3 * heads)
    # Each extra prediction costs 3 * (2H^2 + 2HV).
    assert f(config, 128, 21) - f(config, 128, 20) == 3 * (2 * h * h + 2 * h * v)
    # The vocabulary only matters through the MLM decoder.
    assert f(dataclasses.replace(config, vocab_size=7), 64, 0) == f(config, 64, 0)
    # Attention grows quadratically with the sequence, the rest linearly.
    lin = f(config, 256, 0) - 2 * f(config, 128, 0)
    layers, hh = config.num_layers, config.hidden_size
    assert lin == pytest.approx(
        3 * (layers * 4 * hh * (256**2 - 2 * 128**2) - 2 * hh * hh - 4 * hh)
    )
    with pytest.raises(ValueError, match="seq_len"):
        f(config, 0, 1)
    with pytest.raises(ValueError, match="num_predictions"):
        f(config, 8, -1)


def _dot_flops(jaxpr) -> int:
    """2 * multiply-adds of every dot_general in a jaxpr, nested jaxprs included."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = eqn.invars[0].aval.shape
            total += (
                2
                * math.prod(eqn.outvars[0].aval.shape)
                * math.prod(lhs_shape[d] for d in lhs_contract)
            )
        repeat = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(sub, jax_core.ClosedJaxpr):
                    total += repeat * _dot_flops(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    total += repeat * _dot_flops(sub)
    return total


def test_flops_equal_the_models_matmuls():
    # The formula must equal the dot products the model really traces: forward = 1/3 of
    # the training count, and forward + gradients = the training count.
    config = dataclasses.replace(
        SMALL_BERT,
        vocab_size=50,
        num_heads=4,
        max_position_embeddings=32,
        # The blocked CPU path runs the same products inside a loop over blocks, whose body
        # the jaxpr walker below would count once.
        attention_impl="xla",
    )
    seq, preds = 16, 5
    model = BertForPreTraining(config)
    ids = jnp.zeros((1, seq), jnp.int32)
    positions = jnp.zeros((1, preds), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, positions))

    def loss(params):
        out = model.apply(params, ids, ids, ids, positions)
        return out.mlm_logits.sum() + out.nsp_logits.sum()

    expected = perf.training_flops_per_sequence(config, seq, preds)
    assert _dot_flops(jax.make_jaxpr(loss)(params).jaxpr) == expected / 3
    assert _dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr) == expected


@pytest.mark.parametrize(
    "kind,family",
    [
        ("TPU v2", "TPU v2"),
        ("TPU v3", "TPU v3"),
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5e", "TPU v5e"),
        ("TPU v5litepod", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("TPU v6e", "TPU v6e"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "H200"),
        ("cpu", None),
        ("TPU v4 lite", None),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_device_kind_matching(kind, family):
    assert perf.device_family(kind) == family
    for key in perf.PEAK_FLOPS:  # every table key names its own family
        assert perf.device_family(key) == key


def test_peak_lookup_dtype_precision_and_override():
    assert perf.peak_flops_per_device("TPU v4", "bfloat16") == 275e12
    assert perf.peak_flops_per_device("TPU v5 lite") == 197e12
    assert perf.peak_flops_per_device("TPU v5p") == 459e12
    assert perf.peak_flops_per_device("TPU v6 lite", jnp.bfloat16) == 918e12
    assert perf.peak_flops_per_device("NVIDIA A100-SXM4-80GB", "bfloat16") == 312e12
    assert perf.peak_flops_per_device("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert perf.peak_flops_per_device("NVIDIA H200", "bfloat16") == 989e12
    # float32 follows jax's matmul precision: tf32 / 1 bf16 pass by default, true fp32 /
    # 6 bf16 passes at "highest".
    a100 = "NVIDIA A100-SXM4-80GB"
    assert perf.peak_flops_per_device(a100, "float32", precision="default") == 156e12
    assert perf.peak_flops_per_device(a100, "float32", precision="highest") == 19.5e12
    assert perf.peak_flops_per_device("NVIDIA H200", "float32", precision="float32") == 67e12
    assert perf.peak_flops_per_device("TPU v4", "float32", precision="default") == 275e12
    assert perf.peak_flops_per_device("TPU v4", "float32", precision="high") == 275e12 / 3
    with jax.default_matmul_precision("highest"):
        assert perf.peak_flops_per_device("NVIDIA H100 80GB HBM3", "float32") == 67e12
    assert perf.peak_flops_per_device("TPU v4", "float16") is None
    # Unknown devices give None unless overridden; the override always wins.
    assert perf.peak_flops_per_device("cpu", "float32") is None
    assert perf.peak_flops_per_device("cpu", "float32", override=1.5e11) == 1.5e11
    assert perf.peak_flops_per_device("TPU v4", override=1e12) == 1e12
    assert perf.peak_flops_per_device(None, "float32") is None  # the test devices are CPUs
    with pytest.raises(ValueError, match="override"):
        perf.peak_flops_per_device("cpu", override=-1.0)
    with pytest.raises(ValueError, match="dtype"):
        perf.peak_flops_per_device("TPU v4", "int8")


def test_measure_matmul_flops_runs():
    achieved = perf.measure_matmul_flops("float32", size=64, repeats=2)
    assert np.isfinite(achieved) and achieved > 0
    with pytest.raises(ValueError, match="size"):
        perf.measure_matmul_flops(size=0)


def test_rows_per_call_keeps_cpu_calls_within_the_token_budget():
    budget = perf.CPU_TOKENS_PER_CALL
    for length in (8, 64, 128, 384, 512, 4096):
        rows = perf.rows_per_call(length, 32, platform="cpu")
        assert rows & (rows - 1) == 0  # a power of two: few distinct shapes to compile
        assert rows == 32 or rows * length <= budget < 2 * rows * length or rows == 1
    assert perf.rows_per_call(16, 32, platform="cpu") == 32  # short rows: the whole batch
    assert perf.rows_per_call(384, 32, platform="cpu") == 4
    assert perf.rows_per_call(budget * 4, 32, platform="cpu") == 1
    # The budget is per device: a mesh's data-parallel size multiplies the rows.
    assert perf.rows_per_call(384, 32, multiple=8, platform="cpu") == 32
    assert perf.rows_per_call(384, 16, multiple=8, platform="cpu") == 16
    assert perf.rows_per_call(budget * 4, 32, multiple=8, platform="cpu") == 8
    # Accelerators keep the whole batch.
    assert perf.rows_per_call(512, 32, platform="gpu") == 32
    assert perf.rows_per_call(512, 32, platform="tpu") == 32
