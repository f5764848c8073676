"""Shared by the tests of seq2seq_torch in every tier (moved from test_seq2seq_parity.py)."""

import transformers

from tests.helpers.seq2seq import CONFIG, EOS, START, VOCAB, logits_of, random_params, sources  # noqa: F401


def hf_model(directory):
    return transformers.EncoderDecoderModel.from_pretrained(directory).eval()
