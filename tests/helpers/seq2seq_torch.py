"""A directory of ours opened by transformers as an EncoderDecoderModel: the torch side of the
seq2seq parity checks (imports torch)."""

import transformers

from tests.helpers.seq2seq import CONFIG, EOS, START, VOCAB, logits_of, random_params, sources  # noqa: F401


def hf_model(directory):
    return transformers.EncoderDecoderModel.from_pretrained(directory).eval()
