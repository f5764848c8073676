"""Using and exporting models on gs:// (against the GCS emulator of conftest's `gcs` fixture):
Hugging Face and sentence-transformers exports written to a bucket and read back, fine-tuning
reading its files from a bucket, and bad cloud input (missing bucket or object, no
credentials, no permission) ending in one line that names the path."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import flax.linen as nn
import fsspec
import gcsfs
import google.auth.exceptions
import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.model import BertForPreTraining, pretraining_init
from bertjax.engine.settings import ConfigError
from bertjax.finetune import loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.inference import InferenceError, Model
from bertjax.storage import fs
from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed import task as sentence_embedding
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.qa import decode as qa_decode
from bertjax.tasks.qa import squad as qa
from bertjax.text.directory import load_tokenizer
from bertjax.text.training import TokenizerSettings, train_tokenizer
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.gcs_use import WORDS, _files, _finetune_config, _objects, _write_rows
from tests.helpers.tokenizer import training_sentences

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPORT_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(config, params, tokenizer): a random 2-layer BERT, hidden 32, and a small
    sentencepiece vocabulary."""
    root = tmp_path_factory.mktemp("tiny")
    sentences = training_sentences(400)[:400] + list(WORDS.values()) * 20  # English only
    tokenizer = train_tokenizer(
        sentences, TokenizerSettings(vocab_size=600, num_threads=1), root / "tokenizer.model"
    )
    config = dataclasses.replace(SMALL_BERT, vocab_size=tokenizer.vocab_size)
    boxed = jax.jit(pretraining_init(BertForPreTraining(config), 8, 2))(jax.random.key(0))
    params = jax.tree.map(np.asarray, nn.meta.unbox(boxed))
    return config, params, tokenizer


def _download(gcs, url: str, local: pathlib.Path) -> pathlib.Path:
    for name, data in _objects(gcs, url).items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    return local


# ----------------------------------------------------------------------------- exports


def test_hf_export_to_gcs_matches_local_export_and_loads_back(gcs, tiny, tmp_path):
    config, params, tokenizer = tiny
    remote = gcs.bucket() + "/exports/tiny"
    bert_hf.save(config, params, remote, tokenizer=tokenizer)
    bert_hf.save(config, params, tmp_path / "local", tokenizer=tokenizer)

    # The same files, byte for byte, as the local export: nothing else (no staging leftovers).
    objects = _objects(gcs, remote)
    assert set(objects) == EXPORT_FILES
    assert objects == _files(tmp_path / "local")

    loaded_config, loaded = bert_hf.load(remote)
    assert loaded_config == config
    flat, _ = jax.tree.flatten_with_path(params)
    back = dict(jax.tree.flatten_with_path(loaded)[0])
    for path, leaf in flat:
        np.testing.assert_array_equal(back[path], leaf)
    assert load_tokenizer(remote).fingerprint == tokenizer.fingerprint


def test_model_save_hf_to_gcs_then_load_gives_equal_outputs(gcs, tiny, tmp_path):
    config, params, tokenizer = tiny
    model = Model(config, params, tokenizer)
    remote = gcs.bucket() + "/model"
    model.save_hf(remote)
    reloaded = Model.load(remote)
    texts = ["the film was [MASK] and warm", "the plot was dull"]
    np.testing.assert_array_equal(reloaded.embed(texts), model.embed(texts))
    assert reloaded.fill_mask(texts[0], top_k=3) == model.fill_mask(texts[0], top_k=3)

    # transformers reads a plain copy of the bucket's objects, with the same logits.
    local = _download(gcs, remote, tmp_path / "copy")
    theirs = transformers.BertForPreTraining.from_pretrained(local).eval()
    ids = np.asarray([tokenizer.encode("the film was good")], np.int32)  # [1, seq]
    with torch.no_grad():
        logits = theirs(input_ids=torch.from_numpy(ids).long()).prediction_logits.numpy()
    ours = BertForPreTraining(config).apply(
        {"params": params}, ids, np.zeros_like(ids), np.ones_like(ids)
    )
    np.testing.assert_allclose(np.asarray(ours.mlm_logits), logits, atol=1e-4)


def test_sbert_export_to_gcs_and_back(gcs, tiny, tmp_path):
    config, params, tokenizer = tiny
    spec = EmbeddingSpec(pooling="mean", normalize=True, max_seq_length=32)
    remote = gcs.bucket() + "/sbert"
    sbert.save(remote, config, {"bert": params["bert"]}, tokenizer, spec)
    sbert.save(tmp_path / "local", config, {"bert": params["bert"]}, tokenizer, spec)
    objects = _objects(gcs, remote)
    local = _files(tmp_path / "local")
    assert objects == local  # the empty 2_Normalize/ directory has no object
    assert (tmp_path / "local" / sbert.NORMALIZE_DIR).is_dir()

    assert sbert.is_sentence_transformers_dir(remote)
    loaded = sbert.load(remote)
    assert loaded.spec == spec
    assert loaded.tokenizer.fingerprint == tokenizer.fingerprint
    texts = ["the film was good", "the plot was dull and cold"]
    from_bucket = Model.load(remote).embed(texts)
    np.testing.assert_array_equal(from_bucket, Model.load(tmp_path / "local").embed(texts))
    np.testing.assert_allclose(np.linalg.norm(from_bucket, axis=-1), 1.0, rtol=1e-5)

    # Saved again without normalisation: modules.json has two modules, and it loads so.
    sbert.save(
        remote,
        config,
        {"bert": params["bert"]},
        tokenizer,
        dataclasses.replace(spec, normalize=False),
    )
    fsspec.filesystem("gs").invalidate_cache()
    assert len(json.loads(_objects(gcs, remote)["modules.json"])) == 2
    assert sbert.load(remote).spec.normalize is False


# ----------------------------------------------------------------------------- fine-tuning


@pytest.mark.slow
def test_finetune_reads_its_files_from_gcs(gcs, tiny, tmp_path):
    config, params, tokenizer = tiny
    init_from = tmp_path / "init"
    bert_hf.save(config, params, init_from, tokenizer=tokenizer)
    data = gcs.bucket() + "/task"
    fields = {
        "task": "classification",
        "data.train": _write_rows(data + "/train.csv", 64, 1),
        "data.validation": _write_rows(data + "/dev.csv", 32, 2),
        "data.test": _write_rows(data + "/test.csv", 8, 3),
    }
    settings = FinetuneSettings.from_config(_finetune_config(init_from, **fields))
    workdir = tmp_path / "run"
    summary = loop.finetune(settings, workdir)
    assert summary["seeds"][0]["best"]["value"] >= 0.0
    predictions = (workdir / "predictions_test.tsv").read_text().splitlines()
    assert len(predictions) == 1 + 8  # a header and one line per test row
    assert json.loads((workdir / "result.json").read_text())["steps"] == 2 * (64 // 16)


@pytest.mark.slow
def test_finetune_from_gcs_init_into_gcs_workdir(gcs, pretrained_run, tmp_path, monkeypatch):
    """init_from (a pretraining work directory), task files and workdir all in a bucket;
    nothing written locally; the run opens again from the bucket with Model.load."""
    bucket = gcs.bucket()
    gcs.fs.put(str(pretrained_run[0]), bucket[len("gs://") :] + "/init", recursive=True)
    fields = {
        "task": "classification",
        "data.train": _write_rows(bucket + "/task/train.csv", 64, 1),
        "data.validation": _write_rows(bucket + "/task/dev.csv", 32, 2),
        "data.test": _write_rows(bucket + "/task/test.csv", 8, 3),
    }
    settings = FinetuneSettings.from_config(_finetune_config(bucket + "/init", **fields))
    monkeypatch.chdir(tmp_path)
    workdir = bucket + "/run"
    summary = loop.finetune(settings, workdir)
    assert list(tmp_path.iterdir()) == []  # no local "gs:" directory, no stray files
    objects = _objects(gcs, workdir)
    assert {"result.json", "predictions_test.tsv", "tokenizer.model"} <= set(objects)
    assert any(name.startswith("best/") for name in objects)
    assert any(name.startswith("checkpoints/") for name in objects)
    result = json.loads(objects["result.json"])
    assert result["steps"] == 2 * (64 // 16)
    assert result["best"] == summary["seeds"][0]["best"]
    assert len(objects["predictions_test.tsv"].decode().splitlines()) == 1 + 8

    model = Model.load(workdir)  # the best checkpoint, from the bucket
    assert model.source.startswith(workdir) and "(best)" in model.source
    texts = [line.split(",")[0] for line in fs.read_text(fields["data.test"]).splitlines()[1:]]
    labels = [p["label"] for p in model.predict(texts)]
    written = [line.split("\t") for line in objects["predictions_test.tsv"].decode().splitlines()]
    assert labels == [row[1] for row in written[1:]]


def test_glue_directory_on_gcs_resolves_its_files(gcs, tiny, tmp_path):
    config, params, tokenizer = tiny
    init_from = tmp_path / "init"
    bert_hf.save(config, params, init_from, tokenizer=tokenizer)
    glue = gcs.bucket() + "/glue/SST-2"
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        fs.write_text(f"{glue}/{name}", "sentence\tlabel\nthe film was good\t1\n")
    settings = FinetuneSettings.from_config(
        _finetune_config(init_from, **{"data.glue_task": "sst2", "data.dir": glue})
    )
    assert settings.data.train == f"{glue}/train.tsv"
    assert settings.data.validation == (("validation", f"{glue}/dev.tsv"),)
    assert settings.data.test == (("test", f"{glue}/test.tsv"),)
    # Another directory without dev.tsv (not a deletion: the emulator has hung on a read
    # that followed a delete).
    partial = glue + "-partial"
    fs.write_text(f"{partial}/train.tsv", "sentence\tlabel\nthe film was good\t1\n")
    with pytest.raises(ConfigError, match="config.data.dir=.*has no dev.tsv"):
        FinetuneSettings.from_config(
            _finetune_config(init_from, **{"data.glue_task": "sst2", "data.dir": partial})
        )


def test_squad_and_retrieval_files_read_from_gcs_and_predictions_written_there(gcs, tiny, tmp_path):
    squad = {
        "version": "1.1",
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": "The cat sat on the mat.\r\nIt slept.",
                        "qas": [
                            {
                                "id": "a",
                                "question": "Who sat?",
                                "answers": [{"text": "The cat", "answer_start": 0}],
                            }
                        ],
                    }
                ],
            }
        ],
    }
    bucket = gcs.bucket()
    text = "\ufeff" + json.dumps(squad, indent=1).replace("\n", "\r\n")  # a mark, CRLF lines
    fs.write_text(bucket + "/squad/dev.json", text)
    (tmp_path / "dev.json").write_text(text, encoding="utf-8", newline="")
    remote = qa.read_examples(bucket + "/squad/dev.json")
    local = qa.read_examples(tmp_path / "dev.json")
    assert [dataclasses.replace(e, where="") for e in remote.examples] == [
        dataclasses.replace(e, where="") for e in local.examples
    ]
    assert remote.examples[0].where.startswith(bucket + "/squad/dev.json: ")
    assert remote.source == bucket + "/squad/dev.json"

    predictions = qa_decode.QAPredictions(
        {"a": "The cat"}, {"a": [qa_decode.Candidate("The cat", 0, 7, 2.0, 1.5, 0.9)]}, None
    )
    written = qa_decode.write_predictions(bucket + "/run/predictions_validation", predictions)
    qa_decode.write_predictions(tmp_path / "predictions", predictions)
    assert written == [
        f"{bucket}/run/predictions_validation/{qa_decode.PREDICTIONS_FILE}",
        f"{bucket}/run/predictions_validation/{qa_decode.NBEST_FILE}",
    ]
    assert _objects(gcs, bucket + "/run/predictions_validation") == _files(tmp_path / "predictions")

    _, _, tokenizer = tiny
    files = {
        "queries": "q1\twhat was good\nq2\twhat was dull\n",
        "corpus": "d1\tthe film was good\r\nd2\tthe plot was dull\r\n",
        "relevance": "q1\td1\nq2\td2\n",
    }
    for name, content in files.items():
        fs.write_text(f"{bucket}/retrieval/{name}.tsv", content)
    retrieval = sentence_embedding.read_retrieval(
        *(f"{bucket}/retrieval/{name}.tsv" for name in files), tokenizer, 16
    )
    assert retrieval.queries == 2
    assert retrieval.relevant == (frozenset({0}), frozenset({1}))


# ----------------------------------------------------------------------------- bad input


def test_missing_bucket_and_object_name_the_path(gcs, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InferenceError) as missing_bucket:
        Model.load("gs://no-such-bucket-4d2/run")
    message = str(missing_bucket.value)
    assert "\n" not in message
    assert "gs://no-such-bucket-4d2/run" in message and "bucket" in message
    bucket = gcs.bucket()
    with pytest.raises(InferenceError, match=f"{bucket}/none does not exist"):
        Model.load(bucket + "/none")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        bert_hf.load(bucket + "/none")
    with pytest.raises(fs.StorageError, match="the bucket gs://no-such-bucket-4d2 does not"):
        sbert.load("gs://no-such-bucket-4d2/sbert")
    assert list(tmp_path.iterdir()) == []  # nothing local under a mangled name ("gs:/...")


def _cli_finetune(tmp_path, init_from, *overrides):
    """finetune.py's last stderr line and exit status."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "finetune.py"), f"--config.init_from={init_from}", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stderr.strip().splitlines()[-1], done.returncode


@pytest.mark.slow
def test_finetune_cli_bad_cloud_input_ends_in_one_line(gcs, tiny, tmp_path):
    config, params, tokenizer = tiny
    init_from = tmp_path / "init"
    bert_hf.save(config, params, init_from, tokenizer=tokenizer)
    bucket = gcs.bucket()
    good = _write_rows(bucket + "/dev.csv", 8, 1)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    base = ["--config.task=classification", f"--workdir={bucket}/ft"]
    line, status = _cli_finetune(
        cwd,
        init_from,
        *base,
        "--config.data.train=gs://no-such-bucket-4d2/x.csv",
        f"--config.data.validation={good}",
    )
    assert status != 0
    assert line == (
        "error: config.data.train: gs://no-such-bucket-4d2/x.csv: cannot read: the bucket "
        "gs://no-such-bucket-4d2 does not exist"
    )
    line, status = _cli_finetune(
        cwd,
        init_from,
        *base,
        f"--config.data.train={bucket}/none.csv",
        f"--config.data.validation={good}",
    )
    assert status != 0
    assert line == f"error: config.data.train='{bucket}/none.csv': no such file"
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    "raised, said",
    [
        (OSError("Forbidden: b/o\nno storage.objects.get access"), "permission denied"),
        (
            google.auth.exceptions.DefaultCredentialsError(
                "Your default credentials were not found."
            ),
            "no Google Cloud credentials found",
        ),
    ],
)
def test_credentials_and_permission_errors_name_the_path(
    gcs, tiny, monkeypatch, tmp_path, raised, said
):
    config, params, tokenizer = tiny
    remote = gcs.bucket() + "/model"
    bert_hf.save(config, params, remote, tokenizer=tokenizer)
    init_from = tmp_path / "init"  # fine-tuning checks init_from before the data
    bert_hf.save(config, params, init_from, tokenizer=tokenizer)
    fsspec.filesystem("gs").invalidate_cache()

    async def refuse(self, *args, **kwargs):
        raise raised

    monkeypatch.setattr(gcsfs.GCSFileSystem, "_call", refuse)
    with pytest.raises(fs.StorageError) as err:
        bert_hf.load(remote)
    assert str(err.value).startswith(f"{remote}: cannot read: {said}")
    assert "\n" not in str(err.value)
    with pytest.raises(InferenceError, match=f"^{remote}: cannot read: {said}"):
        Model.load(remote)
    fields = {
        "task": "classification",
        "data.train": remote + "/train.csv",
        "data.validation": remote + "/dev.csv",
    }
    with pytest.raises(ConfigError, match=f"^config.data.train: {remote}/train.csv: cannot read"):
        FinetuneSettings.from_config(_finetune_config(init_from, **fields))
    with pytest.raises(fs.StorageError, match=f"^{remote}-again/.*: cannot write: {said}"):
        bert_hf.save(config, params, remote + "-again", tokenizer=tokenizer)
