"""Pretraining objectives, one module each, registered in the one list below.

  mlm_sentence  the masked LM + next-sentence or sentence-order prediction (google's BERT)
  mlm           the masked LM alone (RoBERTa, ModernBERT)
  rtd           replaced-token detection (ELECTRA): a generator and a discriminator
  distill       the masked LM learned from a frozen teacher too (DistilBERT)

A new objective is a module (or package) here with a `PretrainObjective` (base.py says what
it owns, how its runs open included) and one line in `OBJECTIVES`; registering it also tells
the run directory and Model how its runs open (bertjax.engine.networks).
"""

from bertjax.pretrain.objectives import distill, mlm, mlm_sentence, rtd
from bertjax.pretrain.objectives.base import (
    RUN_META_KEY,
    PretrainObjective,
    get,
    names,
    register,
)

OBJECTIVES: tuple[PretrainObjective, ...] = (
    mlm_sentence.OBJECTIVE,
    mlm.OBJECTIVE,
    rtd.OBJECTIVE,
    distill.OBJECTIVE,
)
for _objective in OBJECTIVES:
    register(_objective)

__all__ = ["OBJECTIVES", "RUN_META_KEY", "PretrainObjective", "get", "names", "register"]
