"""`mlm`: the masked LM alone (RoBERTa, ModernBERT, NeoBERT); a family's sentence-pair head,
if it has one, stays in the tree (BertForPreTraining's) but is frozen."""

from __future__ import annotations

from typing import Any

from bertjax.pretrain.objectives.masked_lm import MaskedLanguageModel

# The parameters only the sentence-pair task trains: frozen when the objective is MLM only.
SENTENCE_PAIR_PARAMS = ("nsp_head", "bert/pooler")


class Mlm(MaskedLanguageModel):
    name = "mlm"
    sentence_pair = False

    def frozen(self, family: Any, model_config: Any, options: Any = None) -> tuple[str, ...]:
        return SENTENCE_PAIR_PARAMS if family.sentence_pair_head else ()


OBJECTIVE = Mlm()
