"""A bertjax BERT config's sizes in transformers' terms, for the parity checks that build the
transformers model beside ours (imports transformers)."""

import pytest

from bertjax.encoders.bert.config import BertConfig

transformers = pytest.importorskip("transformers")


def transformers_bert(config: BertConfig, **changes):
    """transformers.BertConfig with `config`'s vocabulary, width, depth, heads, feed-forward
    width and positions, then `changes` (in transformers' names)."""
    sizes = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
    )
    return transformers.BertConfig(**{**sizes, **changes})
