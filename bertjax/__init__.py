"""bertjax: BERT, ModernBERT and ELECTRA encoders pretrained and fine-tuned in JAX (Flax
linen, optax, Orbax), used from a notebook, and exchanged with transformers.

Pretraining: masked LM (with next-sentence or sentence-order prediction) or replaced-token
detection, on prepared corpora or weighted mixtures (`train.py`). Fine-tuning: labels,
question answering, sentence embeddings and encoder-decoders (`finetune.py`), and the GLUE
suite over it (`evaluate.py`).

The public API, re-exported here: `Model` (a trained model in a notebook, from a run, an
export or a transformers directory: fill-mask, embeddings, search, and a fine-tuned model's
predict, answer or generate), `load` (a run's checkpoint as (config, params, tokenizer)),
`Tokenizer`, BERT's `BertConfig` (its `PRESETS`), `BertModel`, `BertForPreTraining` and
`BertOutput`, `HeadSpec` (what a fine-tuned head is), `make_mesh` (a device mesh of
bertjax's axes, data, fsdp and tensor, for `Model.load(..., mesh=)`), and the packages
`encoders` (the families) and `tasks` (the capabilities), imported here with the pretraining
objectives (`bertjax.pretrain.objectives`) so that every kind of run opens in a fresh
process.

The package is built in floors, each importing only its own and those below it
(tests/unit/test_import_graph.py checks it), bottom to top:

    storage/       files local and gs://, text files, transformers directories' files
    text/          tokenizers (sentencepiece, WordPiece, tokenizer.json) and features
    data/          pretraining corpora, instances, masking, mixtures, the loader, prepare
    nn/            the families' building blocks: attention, masks, products, packing
    capability.py  the contract each capability implements, and their registry
    encoders/      the families: BERT, ModernBERT, ELECTRA
    engine/        what both runs share: settings, steps, loop, optimizers, checkpoints
    inference/     Model and the one batching path its methods share
    finetune/, pretrain/   the two kinds of run
    tasks/         the capabilities: labels, qa, embed, seq2seq
    glue/          the GLUE suite over fine-tuning runs
    cli.py         the commands' shared edge
"""

from bertjax import encoders, tasks
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import PRESETS, BertConfig
from bertjax.encoders.bert.model import BertForPreTraining, BertModel, BertOutput
from bertjax.engine.rundir import load
from bertjax.inference import Model
from bertjax.nn.sharding import make_mesh
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
    "make_mesh",
    "objectives",
    "tasks",
]
