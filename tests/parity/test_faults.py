"""Faults on the road from a run to its users: exports, task files, damaged weights, loads
beside a live run, noise and permissions.

Each test builds a tiny model (hidden 32, 2 layers, a WordPiece vocabulary) in seconds.
"""

import errno
import json
import logging
import os
import pathlib
import shutil
import stat

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import transformers
from safetensors import numpy as safetensors_numpy

from bertjax.capability import HeadSpec
from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune import warm_start
from bertjax.inference import InferenceError, Model
from bertjax.nn import heads
from bertjax.storage import hf
from bertjax.tasks.embed import task as embed_task
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.labels import model as label_heads
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.tokenizer import training_sentences, write_wordpiece_vocab


def _hf_config(vocab_size: int) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
    )


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("vocab")
    return write_wordpiece_vocab(root / "vocab.txt", training_sentences(300), True, size=300)


def _hf_dir(root: pathlib.Path, vocab: pathlib.Path, cls, seed: int) -> pathlib.Path:
    """A transformers directory of `cls` (BertForPreTraining, BertModel), random weights."""
    size = len(vocab.read_text(encoding="utf-8").splitlines())
    transformers.set_seed(seed)
    cls(_hf_config(size)).save_pretrained(root)
    shutil.copy(vocab, root / "vocab.txt")
    (root / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return root


@pytest.fixture(scope="module")
def pretraining_dir(tmp_path_factory, vocab) -> pathlib.Path:
    return _hf_dir(
        tmp_path_factory.mktemp("pretraining"), vocab, transformers.BertForPreTraining, 0
    )


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, vocab) -> pathlib.Path:
    return _hf_dir(tmp_path_factory.mktemp("encoder"), vocab, transformers.BertModel, 1)


def _same_params(a, b) -> bool:
    flat_a, flat_b = jax.tree.leaves(nn.meta.unbox(a)), jax.tree.leaves(nn.meta.unbox(b))
    return len(flat_a) == len(flat_b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(flat_a, flat_b)
    )


# --------------------------------------------------------------------- 1, 8: exports


def test_failed_export_leaves_the_previous_one_whole(
    pretraining_dir, encoder_dir, tmp_path, monkeypatch
):
    out = tmp_path / "export"
    first = Model.load(pretraining_dir)
    first.save_hf(out)
    (out / "README.md").write_text("notes the user keeps beside the export\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 100)  # what reached the disk before it filled
        raise OSError(errno.ENOSPC, "No space left on device", str(filename))

    monkeypatch.setattr(hf.safetensors_numpy, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        Model.load(encoder_dir).save_hf(out)
    monkeypatch.undo()

    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name != "export"], "staging left behind"
    again = Model.load(out)
    assert _same_params(again.params, first.params)


def test_failed_sentence_transformers_export_leaves_the_previous_one_whole(
    pretraining_dir, tmp_path, monkeypatch
):
    pretrained = Model.load(pretraining_dir)
    out = tmp_path / "export"

    def embedding_model(spec: EmbeddingSpec) -> Model:
        head = embed_task.head_for(spec)
        return Model(pretrained.config, pretrained.params, pretrained.tokenizer, head=head)

    embedding_model(EmbeddingSpec("mean", True, 16)).save_hf(out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 100)  # what reached the disk before it filled
        raise OSError(errno.ENOSPC, "No space left on device", str(filename))

    monkeypatch.setattr(hf.safetensors_numpy, "save_file", disk_full)
    with pytest.raises(OSError, match=f"cannot write {out}: No space left"):
        embedding_model(EmbeddingSpec("cls", False, 8)).save_hf(out)
    monkeypatch.undo()
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert not [p for p in tmp_path.iterdir() if p.name != "export"], "staging left behind"
    assert Model.load(out).head.options.spec == EmbeddingSpec("mean", True, 16)
    # Over it, a complete export replaces it, the Normalize module it no longer lists too.
    embedding_model(EmbeddingSpec("cls", False, 8)).save_hf(out)
    assert Model.load(out).head.options.spec == EmbeddingSpec("cls", False, 8)
    assert not (out / "2_Normalize").exists()


def test_an_export_into_an_unwritable_place_names_that_place(pretraining_dir, tmp_path):
    # A file where a directory would go: no export can be written there, even as root.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a directory\n")
    out = blocked / "export"
    with pytest.raises(OSError, match=f"cannot write {out}: "):
        Model.load(pretraining_dir).save_hf(out)
    assert blocked.read_text() == "a file, not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked"]


def test_export_follows_the_umask(pretraining_dir, tmp_path):
    previous = os.umask(0o022)
    try:
        Model.load(pretraining_dir).save_hf(tmp_path / "export")
    finally:
        os.umask(previous)
    for file in (tmp_path / "export").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o644, file.name


# --------------------------------------------------------------------- 2: untrained heads


def test_export_of_an_encoder_leaves_out_the_heads_it_never_had(encoder_dir, tmp_path):
    model = Model.load(encoder_dir)
    with pytest.raises(InferenceError, match="has no masked-LM head"):
        model.fill_mask("a [MASK] here")
    out = tmp_path / "export"
    model.save_hf(out)
    config = json.loads((out / hf.CONFIG_NAME).read_text())
    assert config["architectures"] == ["BertModel"]
    names = set(safetensors_numpy.load_file(out / hf.SAFE_WEIGHTS_NAME))
    assert not [n for n in names if n.startswith("cls.")]
    reloaded = Model.load(out)
    with pytest.raises(InferenceError, match="has no masked-LM head"):
        reloaded.fill_mask("a [MASK] here")
    np.testing.assert_allclose(reloaded.embed("same words"), model.embed("same words"), atol=1e-6)
    # transformers reads it as the BertModel it is.
    base = transformers.BertModel.from_pretrained(out)
    assert base.config.architectures == ["BertModel"]


# --------------------------------------------------------------------- 3, 4: task files


# --------------------------------------------------------------------- 5: damaged weights


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_weights_are_named(pretraining_dir, tmp_path, damage):
    broken = tmp_path / "broken"
    shutil.copytree(pretraining_dir, broken)
    weights = broken / hf.SAFE_WEIGHTS_NAME
    data = weights.read_bytes()
    weights.write_bytes(data[:100] if damage == "truncated" else os.urandom(len(data)))
    with pytest.raises(InferenceError) as err:
        Model.load(broken)
    message = str(err.value)
    assert message.startswith(f"{weights}: not a readable safetensors file")
    assert "\n" not in message
    with pytest.raises(ConfigError, match=f"{weights}: not a readable safetensors file"):
        warm_start.open_source(broken)


def test_malformed_config_json_is_named(pretraining_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pretraining_dir, broken)
    config = broken / hf.CONFIG_NAME
    config.write_text('{"model_type": "bert",\n  "hidden_size": 32,,\n}')
    with pytest.raises(InferenceError, match=f"{config}: line 2: not valid JSON"):
        Model.load(broken)
    config.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=f"{config}: holds a JSON list"):
        warm_start.open_source(broken)


# --------------------------------------------------------------------- 6, 7, 8: run directories


# Readers never read the optimizer state; a checkpoint still has one.
OPT_STATE = {"count": np.zeros((), np.int32)}


def _save_steps(workdir: pathlib.Path, steps, params_for, meta: dict) -> None:
    with checkpoint_lib.Checkpointer(
        workdir / rundir.CHECKPOINT_DIR, max_to_keep=10, save_interval_steps=1, async_save=False
    ) as checkpointer:
        for step in steps:
            checkpointer.save(
                step, params=params_for(step), opt_state=OPT_STATE, meta=meta, force=True
            )


@pytest.fixture(scope="module")
def bert(pretraining_dir):
    """(config, host params, tokenizer) of the pretraining directory, read by bertjax."""
    config, params = bert_hf.load(pretraining_dir)
    return config, params, load_tokenizer(pretraining_dir)


def _meta(config: BertConfig, tokenizer: WordPieceTokenizer, **extra) -> dict:
    return {
        "model_config": config.to_dict(),
        "tokenizer_fingerprint": tokenizer.fingerprint,
        **extra,
    }


def test_finetuning_run_without_best_is_a_finetuning_run(bert, tmp_path):
    config, _, tokenizer = bert
    head = HeadSpec("classification", ("neg", "pos"))
    model = label_heads.make_model(config, head.task, head.num_outputs)
    params = jax.tree.map(
        np.asarray,
        nn.meta.unbox(
            jax.jit(lambda key: heads.init_params(model, key, seq_len=4))(jax.random.key(0))
        ),
    )
    workdir = tmp_path / "run"
    _save_steps(workdir, [3], lambda step: params, _meta(config, tokenizer, head=head.to_dict()))
    tokenizer.save(workdir / rundir.tokenizer_file(tokenizer))
    assert not (workdir / rundir.BEST_CHECKPOINT_DIR).exists()
    loaded = Model.load(workdir)
    assert loaded.head == head
    (prediction,) = loaded.predict(["a short text"])
    assert prediction["label"] in head.labels
    with pytest.raises(InferenceError, match="has no masked-LM head"):
        loaded.fill_mask("a [MASK] here")


@pytest.fixture()
def pretraining_workdir(bert, tmp_path):
    """A work directory with steps 2 and 4, whose parameters differ."""
    config, params, tokenizer = bert
    workdir = tmp_path / "run"

    def params_for(step):
        return jax.tree.map(lambda x: (x + step).astype(x.dtype), params)

    _save_steps(workdir, [2, 4], params_for, _meta(config, tokenizer))
    tokenizer.save(workdir / rundir.tokenizer_file(tokenizer))
    return workdir, params_for


def test_load_beside_a_live_run_reads_the_newest_step(pretraining_workdir, monkeypatch, caplog):
    """The trainer keeps one step: while a reader reads step 2, it saves 4 and deletes 2."""
    workdir, params_for = pretraining_workdir
    steps_dir = workdir / rundir.CHECKPOINT_DIR
    aside = workdir.parent / "step4-not-yet-written"
    shutil.move(steps_dir / "4", aside)
    original = ocp.CheckpointManager.restore
    swapped = []

    def restore(self, step, *args, **kwargs):
        if step == 2 and (steps_dir / "2").exists() and not swapped:
            swapped.append(step)
            shutil.move(aside, steps_dir / "4")  # the trainer's new save ...
            shutil.rmtree(steps_dir / "2")  # ... and its deletion of the older step
        return original(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
    with caplog.at_level(logging.INFO):
        model = Model.load(workdir)
    assert swapped
    assert model.source.endswith("step 4")
    assert _same_params(model.params, params_for(4))  # bit for bit what was saved
    assert "refusing to start from scratch" not in caplog.text


def test_reader_failure_speaks_as_a_reader(pretraining_workdir, monkeypatch):
    workdir, _ = pretraining_workdir

    def unreadable(self, step, *args, **kwargs):
        raise OSError(f"cannot read step {step}")

    monkeypatch.setattr(ocp.CheckpointManager, "restore", unreadable)
    with pytest.raises(InferenceError) as err:
        Model.load(workdir)
    assert "refusing to start from scratch" not in str(err.value)
    assert "no checkpoint in" in str(err.value) and "could be read" in str(err.value)


def test_load_prints_no_read_only_warning(pretraining_workdir, caplog):
    workdir, _ = pretraining_workdir
    with caplog.at_level(logging.WARNING):
        Model.load(workdir)
    assert "read only" not in caplog.text


# --------------------------------------------------------------------- 9: saves on many devices

REPO = pathlib.Path(__file__).resolve().parents[2]
