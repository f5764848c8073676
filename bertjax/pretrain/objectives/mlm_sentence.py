"""`mlm_sentence`: the masked LM plus the sentence-pair task that data.task names
(next-sentence or sentence-order prediction: google's BERT and ALBERT)."""

from __future__ import annotations

from typing import Any

import ml_collections

from bertjax.pretrain.objectives.masked_lm import MaskedLanguageModel
from bertjax.settings import require


class MlmSentence(MaskedLanguageModel):
    name = "mlm_sentence"
    sentence_pair = True

    def check(self, config: ml_collections.ConfigDict, family: Any, layout: str) -> None:
        """The pair task needs sentence pairs and a family with a next-sentence head."""
        require(
            config,
            layout != "packed",
            "objective",
            "the sentence-pair task needs sentence pairs but config.data.layout='packed' holds "
            "whole documents; set objective='mlm' or data.layout='pairs'",
        )
        require(
            config,
            family.sentence_pair_head,
            "objective",
            f"the sentence-pair task needs a next-sentence head, which "
            f"config.model.family={family.name!r} has not; set objective='mlm'",
        )


OBJECTIVE = MlmSentence()
