"""bertjax: BERT pretraining (masked LM + next-sentence prediction) in JAX.

The public API: the model and its config, the tokenizer, `Model` to use a trained model
(fill-mask, embeddings; from a run, an export or a Hugging Face directory) and `load` to
open a training run's checkpoint as (config, params, tokenizer). Data preparation lives in
`bertjax.data`, Hugging Face interop in `bertjax.storage.hf` (needs the `hf` extra), pretraining in
`bertjax.pretrain`, fine-tuning in `bertjax.finetune`, and the capabilities a fine-tuned
model has (question answering, embeddings, generation, labels) in `bertjax.tasks`, which is
imported here with the pretraining objectives (`bertjax.pretrain.objectives`) so that every
kind of run opens in a fresh process. The encoder architectures those capabilities build on
(BERT, ModernBERT, ELECTRA) are the families of `bertjax.encoders`.
"""

from bertjax import encoders, tasks
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import PRESETS, BertConfig
from bertjax.encoders.bert.model import BertForPreTraining, BertModel, BertOutput
from bertjax.engine.rundir import load
from bertjax.inference import Model
from bertjax.pretrain import objectives
from bertjax.text.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertModel",
    "BertOutput",
    "HeadSpec",
    "Model",
    "Tokenizer",
    "encoders",
    "load",
    "objectives",
    "tasks",
]
