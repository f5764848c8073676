"""`mlm_sentence`: the masked LM plus the sentence-pair task that data.task names
(next-sentence or sentence-order prediction: google's BERT and ALBERT)."""

from __future__ import annotations

from typing import Any

from bertjax.pretrain.objectives.base import require
from bertjax.pretrain.objectives.masked_lm import MaskedLanguageModel


class MlmSentence(MaskedLanguageModel):
    name = "mlm_sentence"
    sentence_pair = True

    def check(self, values, family: Any, layout: str) -> None:
        """The pair task needs sentence pairs and a family with a next-sentence head."""
        require(
            values,
            layout != "packed",
            "objective",
            "the sentence-pair task needs sentence pairs but config.data.layout='packed' holds "
            "whole documents; set objective='mlm' or data.layout='pairs'",
        )
        require(
            values,
            family.sentence_pair_head,
            "objective",
            f"the sentence-pair task needs a next-sentence head, which "
            f"config.model.family={family.name!r} has not; set objective='mlm'",
        )


OBJECTIVE = MlmSentence()
