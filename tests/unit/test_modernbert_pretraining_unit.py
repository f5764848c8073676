"""The unit tests of test_modernbert_pretraining.py (tests/integration/), with its helpers."""

import dataclasses
import types

import pytest

from bertjax import encoders
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine import rundir


def test_a_new_phase_may_change_the_rotary_theta_but_a_resumed_run_may_not():
    tokenizer = types.SimpleNamespace(fingerprint="f" * 64)
    short = ModernBertConfig.preset(
        "tiny", vocab_size=100, pad_token_id=0, cls_token_id=1, sep_token_id=2
    )
    short = dataclasses.replace(short, global_rope_theta=10_000.0)
    meta = {"tokenizer_fingerprint": "f" * 64, "model_config": encoders.config_to_dict(short)}
    longer = dataclasses.replace(short, global_rope_theta=160_000.0)
    changed = rundir.check_compatible(meta, tokenizer, longer, "init_from", new_phase=True)
    assert changed == {"global_rope_theta": [10_000.0, 160_000.0]}
    assert rundir.check_compatible(meta, tokenizer, short, "init_from", new_phase=True) == {}
    with pytest.raises(rundir.IncompatibleCheckpointError, match="global_rope_theta=10000.0"):
        rundir.check_compatible(meta, tokenizer, longer, "the checkpoint")  # a resumed run
    wider = dataclasses.replace(longer, hidden_size=128)
    with pytest.raises(rundir.IncompatibleCheckpointError, match="hidden_size=64"):
        rundir.check_compatible(meta, tokenizer, wider, "init_from", new_phase=True)
