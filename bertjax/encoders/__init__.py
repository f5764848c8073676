"""Encoder families: the encoder the capabilities build on, one object per architecture.

    family.py             the EncoderFamily interface (config, module, masked-LM model,
                          transformers format) and the registry: family_of(config),
                          for_model_type(config.json's model_type), read_transformers(path),
                          config_to_dict /
                          config_from_dict for checkpoint meta
    bert.py               BERT: bertjax.model and bertjax.hf
    modernbert.py         ModernBERT's config, linen modules and weight mapping
    modernbert_family.py  ModernBERT as a family: the encoder with its prediction head, the
                          masked-LM model, transformers' ModernBert* directories
    electra/              ELECTRA: config, modules, transformers' Electra* directories, family

A new family is one module that builds an EncoderFamily and one line below.
"""

from bertjax.encoders import bert, family, modernbert_family
from bertjax.encoders.electra import family as electra
from bertjax.encoders.family import (
    DEFAULT_FAMILY,
    FAMILY_KEY,
    EncoderFamily,
    Network,
    config_from_dict,
    config_to_dict,
    family_of,
    for_model_type,
    get,
    names,
    read_transformers,
)

FAMILIES = (bert.FAMILY, modernbert_family.FAMILY, electra.FAMILY)

for _family in FAMILIES:
    family.register(_family)

__all__ = [
    "DEFAULT_FAMILY",
    "FAMILIES",
    "FAMILY_KEY",
    "EncoderFamily",
    "Network",
    "config_from_dict",
    "config_to_dict",
    "family_of",
    "for_model_type",
    "get",
    "names",
    "read_transformers",
]
