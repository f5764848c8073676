"""benchmarks.harness.reference: the one torch loop every benchmark's transformers side trains
with, on a tiny BertForSequenceClassification for two steps, and google's decay mask; and
every benchmark, torch's side included, imports as a module of the package."""

import copy
import importlib
import pkgutil

import numpy as np
import pytest
import torch

import benchmarks
from benchmarks.harness import fixtures, reference, timing
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine.optim import OptimizerSettings

SETTINGS = OptimizerSettings(learning_rate=1e-3, warmup_steps=1, total_steps=2, weight_decay=0.01)


def _model_and_batch():
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=50, hidden_dropout=0.0, attention_dropout=0.0)
    model = reference.transformers.BertForSequenceClassification(
        reference.bert_config(config, num_labels=2)
    )
    features, _ = fixtures.sentence_pairs(np.random.default_rng(0), 8, 16, (2, 4), (2, 6), 50)
    batch = reference.tensors(features)
    batch["labels"] = torch.tensor([0, 1] * 4)
    return model, batch


def test_two_steps_train_the_model_and_report_the_last_loss():
    model, batch = _model_and_batch()
    before = copy.deepcopy(model.state_dict())
    optimizer = reference.adamw(model, SETTINGS)
    schedule = reference.linear_schedule(optimizer, SETTINGS)
    loss = reference.train(model, [batch, batch], optimizer, schedule=schedule, max_grad_norm=1.0)
    assert np.isfinite(loss) and loss > 0
    assert optimizer.state[next(model.parameters())]["step"] == 2
    assert schedule.last_epoch == 2 and schedule.get_last_lr()[0] == 0.0  # decayed to the end
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("classifier" in k for k in changed) and any("encoder" in k for k in changed)
    # Timed as any side: its float result is already waited for.
    found = timing.time_call(lambda: reference.train(model, [batch], optimizer), rounds=2, warmup=1)
    assert len(found.rounds) == 2 and found.median > 0


def test_micro_batches_weighted_by_their_share_make_the_whole_batch_s_update():
    whole, batch = _model_and_batch()
    parts = copy.deepcopy(whole)
    halves = [({k: v[rows] for k, v in batch.items()}, 0.5) for rows in (slice(0, 4), slice(4, 8))]
    plain = torch.optim.SGD(whole.parameters(), lr=0.1)
    split = torch.optim.SGD(parts.parameters(), lr=0.1)
    one = reference.train(whole, [batch], plain)
    two = reference.train(parts, [halves], split)
    assert two == pytest.approx(one, rel=1e-5)  # the halves' weighted losses add up
    for a, b in zip(whole.parameters(), parts.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_decay_on_biases_and_layer_norms():
    model, _ = _model_and_batch()
    decayed, kept = reference.adamw(model, SETTINGS).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed["weight_decay"] == 0.01 and kept["weight_decay"] == 0.0
    assert all("bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in kept["params"])
    assert all(reference.no_decay(names[id(p)]) is False for p in decayed["params"])
    (every,) = reference.adamw(model, SETTINGS, decay_mask=False).param_groups
    assert len(every["params"]) == len(list(model.parameters()))


def test_an_empty_loop_and_a_diverged_loss_are_refused():
    model, batch = _model_and_batch()
    optimizer = reference.adamw(model, SETTINGS)
    with pytest.raises(ValueError, match="given no step"):
        reference.train(model, [], optimizer)
    with pytest.raises(FloatingPointError, match="loss is nan"):
        reference.train(model, [batch], optimizer, loss=lambda m, b: m(**b).loss * float("nan"))


@pytest.mark.parametrize(
    "name", sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.ispkg)
)
def test_every_benchmark_is_a_module_that_answers_help(name, capsys):
    """Each benchmark imports as benchmarks.<name> and parses its flags before any work."""
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")
