"""The integration tests of test_question_answering.py (tests/unit/), with its helpers."""

import jax
import numpy as np
import pytest
from test_question_answering import (  # noqa: F401 (fixtures are used by name)
    CONFIG,
    TOKENIZER,
    synthetic_examples,
)

from bertjax import Model, optim, sharding, steps
from bertjax.model import BertConfig
from bertjax.tasks.qa import decode as qa_decode
from bertjax.tasks.qa import metrics as qa_metrics
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad as qa
from bertjax.tasks.qa.answer import window_logits


@pytest.mark.slow
def test_a_short_run_learns_a_synthetic_task(optimized):
    rng = np.random.default_rng(0)
    settings = qa.QASettings(max_seq_length=24, doc_stride=8, max_query_length=4)
    train = qa.make_features(synthetic_examples(rng, 4096), TOKENIZER, settings, training=True)
    test_examples = synthetic_examples(rng, 256)
    test = qa.make_features(test_examples, TOKENIZER, settings, training=False)
    config = BertConfig(
        vocab_size=CONFIG.vocab_size,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = qa_model.QuestionAnswering(config)
    total_steps, batch_size = 800, 32
    optimizer = optim.OptimizerSettings(
        learning_rate=2e-3, warmup_steps=80, total_steps=total_steps, weight_decay=0.01
    )
    tx = optim.make_optimizer(optimizer)
    mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    state_factory = steps.make_state(lambda key: qa_model.init_params(model, key), tx, mesh)
    train_step = jax.jit(
        steps.make_train_step(
            qa_model.QAObjective(model), tx, optim.make_schedule(optimizer), grad_accum_steps=1
        )
    )
    with jax.set_mesh(mesh):
        state = state_factory.init(jax.random.key(0))
        for _ in range(total_steps):
            rows = rng.choice(len(train), batch_size, replace=False)
            state, metrics = train_step(state, train.batch(rows), jax.random.key(1))
    starts, ends = window_logits(Model(config, state.params, TOKENIZER), test)
    result = qa_decode.decode(test_examples, test, starts, ends, settings, version_2=True)
    scores = qa_metrics.evaluate(
        test_examples, result.predictions, version_2=True, null_odds=result.null_odds
    )
    print(f"synthetic 'the wX' (v2.0, 30% unanswerable): {scores}")
    assert float(metrics["train/nonfinite"]) == 0.0
    # Always answering "no answer" scores 30 (NoAns 100, HasAns 0); guessing a word, 8.
    assert scores["exact"] > 80.0
    assert scores["HasAns_exact"] > 80.0 and scores["NoAns_exact"] > 70.0
