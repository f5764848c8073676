"""Encoder families: the encoder the capabilities build on, one object per architecture.

    family.py             the EncoderFamily interface (config, module, masked-LM model,
                          heads, generator, transformers format) and the registry:
                          family_of(config), for_model_type(config.json's model_type),
                          read_transformers(path), config_to_dict / config_from_dict for
                          checkpoint meta
    bert/                 BERT
    modernbert/           ModernBERT
    electra/              ELECTRA

Each family is one folder with the same rooms: config.py, model.py (linen), hf.py
(its tensor map and config translation), family.py (the EncoderFamily). A new family is one
folder and one line below.
"""

from bertjax.encoders import family
from bertjax.encoders.bert import family as bert_family
from bertjax.encoders.electra import family as electra_family
from bertjax.encoders.family import (
    DEFAULT_FAMILY,
    FAMILY_KEY,
    EncoderFamily,
    config_from_dict,
    config_to_dict,
    family_of,
    for_model_type,
    get,
    names,
    read_transformers,
)
from bertjax.encoders.modernbert import family as modernbert_family

# Imported under their own names, so that bertjax.encoders.<family> stays the package.
FAMILIES = (bert_family.FAMILY, modernbert_family.FAMILY, electra_family.FAMILY)

for _family in FAMILIES:
    family.register(_family)

__all__ = [
    "DEFAULT_FAMILY",
    "FAMILIES",
    "FAMILY_KEY",
    "EncoderFamily",
    "config_from_dict",
    "config_to_dict",
    "family_of",
    "for_model_type",
    "get",
    "names",
    "read_transformers",
]
