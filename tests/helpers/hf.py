"""BERT's transformers tensor map: abstract and random parameters of BertForPreTraining, a
written directory's tensors, and a sentencepiece tokenizer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from safetensors import numpy as safetensors_numpy

from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.storage import hf
from bertjax.text.training import TokenizerSettings, train_tokenizer
from tests.helpers.params import random_like
from tests.helpers.tokenizer import training_sentences


def _abstract_params(config, boxed=False):
    """Shapes of BertForPreTraining's params, without compiling its init."""
    variables = jax.eval_shape(
        lambda: BertForPreTraining(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    )
    return variables["params"] if boxed else nn.meta.unbox(variables["params"])


def _random_params(config, seed, boxed=False):
    """Every parameter random (biases and LayerNorm too), in BertForPreTraining's tree."""
    return random_like(_abstract_params(config, boxed), seed)


def _read_dir(path):
    return safetensors_numpy.load_file(path / hf.SAFE_WEIGHTS_NAME)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    return train_tokenizer(
        training_sentences(800)[:800],
        TokenizerSettings(vocab_size=400),
        tmp_path_factory.mktemp("spm") / "tokenizer.model",
    )
