"""The capabilities, one package each, registered in one list.

    labels/    classification, regression, multi-label, token labels  -> Model.predict
    qa/        extractive question answering (SQuAD)                  -> Model.answer
    embed/     sentence embeddings (bi-encoder, sentence-transformers) -> Model.embed, search
    seq2seq/   warm-started encoder-decoders                           -> Model.generate

Each package owns everything about its capability and exports one `CAPABILITY` (a
bertjax.capability.Capability). Importing `bertjax` imports this module, so every kind of
run opens in a fresh process. A new capability is one new package and one line below.
"""

from bertjax import capability
from bertjax.tasks import embed, labels, qa, seq2seq

CAPABILITIES = (
    labels.CAPABILITY,
    qa.CAPABILITY,
    embed.CAPABILITY,
    seq2seq.CAPABILITY,
)

for _capability in CAPABILITIES:
    capability.register(_capability)
