"""bertjax: BERT pretraining (masked LM + next-sentence prediction) in JAX.

The public API: the model and its config, the tokenizer, and `load` to open a training
run's checkpoint in a notebook. Data preparation lives in `bertjax.data`, Hugging Face
interop in `bertjax.hf` (needs the `hf` extra), training in `bertjax.trainer`.
"""

from bertjax.model import PRESETS, BertConfig, BertForPreTraining, BertModel, BertOutput
from bertjax.tokenizer import Tokenizer
from bertjax.workdir import load

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertModel",
    "BertOutput",
    "Tokenizer",
    "load",
]
