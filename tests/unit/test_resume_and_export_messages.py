"""Two messages: a fine-tuning work directory re-used with other head options names the
options that differ; an export onto a full disk keeps the old one and says so in one line."""

import errno
import os
import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import Model
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.finetune import resume
from bertjax.inference import InferenceError
from bertjax.storage import hf
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.task import head_for
from tests.helpers.tokenizer_kinds import write_tokenizer


def test_reusing_an_embedding_workdir_with_another_pooling_names_the_options():
    saved = head_for(EmbeddingSpec(pooling="mean", max_seq_length=64))
    asked = head_for(EmbeddingSpec(pooling="cls", max_seq_length=64))
    run = types.SimpleNamespace(ft=types.SimpleNamespace(head=asked))
    with pytest.raises(resume.HeadMismatchError) as caught:
        resume.check_resumable({"head": saved.to_dict()}, run, "runs/embed")
    message = str(caught.value)
    assert message.startswith(
        "the checkpoint in runs/embed is an embedding head with pooling='mean', but this run "
        "asks pooling='cls'; use another --workdir"
    ), message
    assert "max_seq_length" not in message and "\n" not in message


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    tokenizer = write_tokenizer("wordpiece", tmp_path_factory.mktemp("tok"))
    config = BertConfig(
        vocab_size=-(-tokenizer.vocab_size // 8) * 8,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    ids = np.zeros((1, 4), np.int32)
    init = jax.jit(lambda key: BertForPreTraining(config).init(key, ids, ids, ids)["params"])
    params = init(jax.random.key(0))
    return Model(config, jax.tree.map(np.asarray, nn.meta.unbox(params)), tokenizer)


@pytest.mark.parametrize(
    "failure",
    [
        hf.SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
            'space left on device" })'
        ),
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    ],
    ids=["safetensors", "open"],
)
def test_save_hf_onto_a_full_disk_keeps_the_old_export_and_says_why(
    small_model, tmp_path, monkeypatch, failure
):
    target = tmp_path / "export"
    small_model.save_hf(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def full_disk(*args, **kwargs):
        raise failure

    monkeypatch.setattr(hf.safetensors_numpy, "save_file", full_disk)
    with pytest.raises(InferenceError) as caught:
        small_model.save_hf(target)
    assert isinstance(caught.value, OSError)  # callers catching a failed write still do
    message = str(caught.value)
    assert message.startswith(f"cannot write {target}: "), message
    assert ("StorageFull" if isinstance(failure, hf.SafetensorError) else "No space") in message
    assert "\n" not in message and "partial" not in message
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging left
