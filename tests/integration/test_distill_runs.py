"""Distillation runs end to end, in process: a student learns from a frozen teacher for every
task that distils, from the teacher's own layers or from init_from, with unlabeled examples,
resumes bit-exactly, trains on a mesh with accumulation, and opens as an ordinary model.

The teachers are transformers directories of random tiny models (their quality does not
matter here: what the student is taught is checked against the teacher's own outputs)."""

import dataclasses
import hashlib
import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

import bertjax
from bertjax import encoders
from bertjax.capability import HeadSpec
from bertjax.engine import loop as engine_loop
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune import distill, loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.glue import suite
from bertjax.glue.settings import SuiteSettings
from bertjax.storage import hf
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_recipe
from configs import glue as glue_recipe
from tests.helpers import corpora, glue_data, qa_task
from tests.helpers import embedding as embedding_helpers
from tests.helpers import question_answering as qa_helpers
from tests.helpers.embedding_task import files as embedding_files  # noqa: F401 (fixture)
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.params import random_init

WORDS = [f"w{i}" for i in range(40)]
TOKENIZER = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
CONFIG = dataclasses.replace(SMALL_BERT, vocab_size=len(WORDS) + 5, num_layers=2)
SEQ = 16
HEADS = {
    "classification": HeadSpec("classification", ("neg", "pos")),
    "regression": HeadSpec("regression", ("score",)),
    "multi_label": HeadSpec("multi_label", ("a", "b", "c")),
    "token_classification": HeadSpec("token_classification", ("B", "I", "O")),
}


def _sentence(rng, length=None) -> str:
    return " ".join(rng.choice(WORDS, size=length or int(rng.integers(3, 9))))


def _write_label_files(root: pathlib.Path, task: str, rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    if task == "token_classification":

        def conll(n):
            lines = []
            for _ in range(n):
                lines += [f"{w} {rng.choice(['B', 'I', 'O'])}" for w in _sentence(rng).split()]
                lines.append("")
            return "\n".join(lines) + "\n"

        names = ("train.conll", "dev.conll")
        (root / names[0]).write_text(conll(rows))
        (root / names[1]).write_text(conll(8))
        (root / "more.conll").write_text(
            "\n\n".join("\n".join(_sentence(rng).split()) for _ in range(8)) + "\n"
        )
        return {"data.train": str(root / names[0]), "data.validation": str(root / names[1])}

    def label():
        if task == "regression":
            return f"{rng.uniform(0, 5):.2f}"
        if task == "multi_label":
            return "|".join(sorted(set(rng.choice(["a", "b", "c"], size=2))))
        return str(rng.choice(["neg", "pos"]))

    for name, n in (("train.csv", rows), ("dev.csv", 8)):
        (root / name).write_text(
            "sentence,label\n" + "".join(f"{_sentence(rng)},{label()}\n" for _ in range(n))
        )
    (root / "more.csv").write_text("sentence\n" + "".join(f"{_sentence(rng)}\n" for _ in range(8)))
    fields = {"data.train": str(root / "train.csv"), "data.validation": str(root / "dev.csv")}
    if task == "multi_label":
        fields["data.label_separator"] = "|"
    return fields


def _label_teacher(root: pathlib.Path, head: HeadSpec, seed: int = 0) -> str:
    model = label_heads.make_model(CONFIG, head.task, head.num_outputs)
    params = random_init(
        lambda: nn.meta.unbox(
            model.init(jax.random.key(0), *[np.zeros((1, 1), np.int32)] * 3)["params"]
        ),
        seed,
    )
    encoders.family_of(CONFIG).write_transformers(
        CONFIG, params, root, tokenizer=TOKENIZER, head=head
    )
    return str(root)


def _config(init_from, task, fields, **more):
    config = finetune_recipe.get_config()
    config.init_from = str(init_from)
    config.task = task
    config.data.max_seq_length = SEQ
    config.batch_size = 8
    config.eval_batch_size = 8
    config.num_epochs = 1
    config.log_every_steps = 1
    config.optimizer.learning_rate = 1e-3
    config.update_from_flattened_dict({**fields, **more})
    return config


def _run(config, workdir, devices=None):
    settings = FinetuneSettings.from_config(config, devices=devices)
    return loop.finetune(settings, workdir, devices=devices)


def _digest(directory: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


def _params(workdir) -> dict:
    return jax.device_get(rundir.read_params(rundir.open_run(workdir, best=False))[1])


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    out = {}
    for task, head in HEADS.items():
        (root / task).mkdir()
        out[task] = (
            _label_teacher(root / task / "model", head),
            _write_label_files(root / task, task, 32, 1),
        )
    return root, out


@pytest.mark.parametrize("task", list(HEADS))
def test_a_student_of_the_teachers_first_layer_learns_each_label_task(teachers, task, tmp_path):
    """From the teacher's layer 0 (its head and embeddings with it), with unlabeled examples:
    the student's soft loss falls from its first step, and the run is an ordinary run of the
    task's head (one layer) that Model.load opens."""
    root, made = teachers
    teacher, fields = made[task]
    unlabeled = "more.conll" if task == "token_classification" else "more.csv"
    config = _config(
        "",
        task,
        fields,
        **{
            "distill.teacher": teacher,
            "distill.student_layers": "0",
            "distill.alpha": 1.0,
            "data.unlabeled": str(root / task / unlabeled),
            "num_epochs": 3,
        },
    )
    _run(config, tmp_path / "student")
    lines = [
        json.loads(line)
        for line in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()
    ]
    soft = [line["train/distill_loss"] for line in lines if "train/distill_loss" in line]
    assert len(soft) >= 4 and soft[-1] < soft[0]
    model = bertjax.Model.load(tmp_path / "student")
    assert model.config.num_layers == 1 and model.head.labels == HEADS[task].labels
    assert len(model.predict(["w1 w2 w3"])) == 1


def test_the_student_starts_as_the_teachers_layers_and_the_teacher_is_left_unchanged(
    teachers, tmp_path, capsys
):
    """student_layers=1: the student is the teacher's layer 1 as its layer 0, with the
    teacher's embeddings and head; a run leaves the teacher's files as they were."""
    root, made = teachers
    teacher, fields = made["classification"]
    source = rundir.open_run(teacher)
    student = distill.student_from_teacher(source, (1,))
    assert student.config.num_layers == 1 and student.head == source.head
    ours = dict(hf.flatten_tree(rundir.read_params(student)[1]))
    theirs = dict(hf.flatten_tree(rundir.read_params(source)[1]))
    renamed = {
        tuple("layer_1" if k == "layer_0" else k for k in path): v for path, v in ours.items()
    }
    assert not any("layer_1" in path for path in ours)
    assert renamed.keys() <= theirs.keys() and len(renamed) == len(ours)
    for path, value in renamed.items():
        np.testing.assert_array_equal(value, theirs[path], err_msg=str(path))
    before = _digest(pathlib.Path(teacher))
    config = _config(
        "", "classification", fields, **{"distill.teacher": teacher, "distill.student_layers": "1"}
    )
    _run(config, tmp_path / "student")
    assert "the student: the teacher's layers 1 of 2" in capsys.readouterr().out
    assert _digest(pathlib.Path(teacher)) == before


def test_a_killed_distillation_resumes_bit_exactly(teachers, tmp_path, monkeypatch):
    root, made = teachers
    teacher, fields = made["classification"]
    config = _config(
        "",
        "classification",
        fields,
        **{
            "distill.teacher": teacher,
            "distill.student_layers": "0",
            "num_epochs": 2,
            "checkpoint_every_steps": 2,
        },
    )
    _run(config, tmp_path / "straight")
    with monkeypatch.context() as patch:
        patch.setattr(engine_loop.PreemptionWatcher, "should_stop", lambda self, step: step == 3)
        preempted = _run(config, tmp_path / "resumed")
    assert preempted["preempted"]
    _run(config, tmp_path / "resumed")
    straight, resumed = _params(tmp_path / "straight"), _params(tmp_path / "resumed")
    jax.tree.map(np.testing.assert_array_equal, straight, resumed)


def test_a_mesh_with_accumulation_trains_the_one_device_run(teachers, tmp_path):
    """Eight devices as (data 2, fsdp 2, tensor 2) with two micro-batches against one device
    with none: the teacher's outputs and the soft loss shard and accumulate exactly (to
    float32's summation order)."""
    root, made = teachers
    teacher, fields = made["classification"]
    common = {
        "distill.teacher": teacher,
        "distill.student_layers": "0",
        "data.unlabeled": str(root / "classification" / "more.csv"),
        # Dropout draws differ between a batch and its micro-batches: off, to compare.
        "model.hidden_dropout": 0.0,
        "model.attention_dropout": 0.0,
    }
    one_device = jax.devices()[:1]
    _run(
        _config("", "classification", fields, **common, mesh_shape=(1, 1, 1)),
        tmp_path / "one",
        one_device,
    )
    _run(
        _config("", "classification", fields, **common, mesh_shape=(2, 2, 2), grad_accum_steps=2),
        tmp_path / "mesh",
    )
    one, mesh = _params(tmp_path / "one"), _params(tmp_path / "mesh")
    # After five Adam steps at 1e-3 the two summation orders leave parameters up to 2.8e-6
    # apart; leaving out the 8 unlabeled rows (a fifth of each epoch) moved them by up to
    # 4.3e-3 (measured, one device both times): a lost or doubled part shows far above 1e-5.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), one, mesh)


def test_a_teacher_of_another_task_or_tokenizer_or_depth_is_refused(teachers, tmp_path):
    root, made = teachers
    teacher, fields = made["classification"]
    regression_teacher, _ = made["regression"]
    with pytest.raises(ConfigError, match="is a regression .*this run trains classification"):
        _run(
            _config(
                "",
                "classification",
                fields,
                **{"distill.teacher": regression_teacher, "distill.student_layers": "0"},
            ),
            tmp_path / "a",
        )
    with pytest.raises(
        ConfigError, match=r"student_layers=0,5: the teacher has 2 layers \(0 to 1\), not \[5\]"
    ):
        _run(
            _config(
                "",
                "classification",
                fields,
                **{"distill.teacher": teacher, "distill.student_layers": "0,5"},
            ),
            tmp_path / "b",
        )
    other = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *reversed(WORDS)])
    model_dir = tmp_path / "other"
    label_model = label_heads.make_model(CONFIG, "classification", 2)
    params = random_init(
        lambda: nn.meta.unbox(
            label_model.init(jax.random.key(0), *[np.zeros((1, 1), np.int32)] * 3)["params"]
        ),
        5,
    )
    encoders.family_of(CONFIG).write_transformers(
        CONFIG, params, model_dir, tokenizer=other, head=HEADS["classification"]
    )
    with pytest.raises(ConfigError, match="its tokenizer .* is not the student's"):
        _run(
            _config(model_dir, "classification", fields, **{"distill.teacher": teacher}),
            tmp_path / "c",
        )
    wrong_labels = dict(fields)
    (tmp_path / "labels.csv").write_text("sentence,label\nw1 w2,maybe\nw3 w4,neg\n")
    wrong_labels["data.train"] = str(tmp_path / "labels.csv")
    with pytest.raises(Exception, match="maybe"):
        _run(
            _config(
                "",
                "classification",
                wrong_labels,
                **{"distill.teacher": teacher, "distill.student_layers": "0"},
            ),
            tmp_path / "d",
        )


@pytest.mark.parametrize("content", [b"", b"\x00\xff\x00binary\xfe", b'{"sentence": "w1"}\n'])
def test_an_empty_binary_or_other_unlabeled_file_is_refused_in_one_line(
    teachers, tmp_path, content
):
    root, made = teachers
    teacher, fields = made["classification"]
    path = tmp_path / "more.csv"
    path.write_bytes(content)
    with pytest.raises(Exception) as failure:
        _run(
            _config(
                "",
                "classification",
                fields,
                **{
                    "distill.teacher": teacher,
                    "distill.student_layers": "0",
                    "data.unlabeled": str(path),
                },
            ),
            tmp_path / "run",
        )
    message = str(failure.value)
    assert "more.csv" in message and "\n" not in message.strip()


def _soft_losses(workdir: pathlib.Path) -> list[float]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["train/distill_loss"] for line in lines if "distill_loss" in line]


def test_question_answering_distils_each_span_end_with_unlabeled_questions(tmp_path):
    """A BertForQuestionAnswering teacher, its first layer the student, SQuAD-style files and
    questions without answers: the soft loss over the span ends falls, and the student
    answers as a QA run."""
    rng = np.random.default_rng(0)
    teacher = qa_task.random_export(tmp_path / "teacher")
    train = qa_task.write_jsonl(tmp_path / "train.jsonl", qa_helpers.synthetic_examples(rng, 48))
    dev = qa_task.write_jsonl(tmp_path / "dev.jsonl", qa_helpers.synthetic_examples(rng, 8))
    questions = qa_helpers.synthetic_examples(rng, 16, impossible=0.0)
    more = qa_task.write_jsonl(
        tmp_path / "more.jsonl", [dataclasses.replace(q, answers=()) for q in questions]
    )
    config = qa_task.qa_config(
        "",
        train,
        dev,
        **{
            "distill.teacher": teacher,
            "distill.student_layers": "0",
            "distill.alpha": 1.0,
            "data.unlabeled": more,
            "data.max_seq_length": 32,
            "qa.doc_stride": 16,
            "qa.max_query_length": 8,
            "batch_size": 8,
            "eval_batch_size": 8,
            "num_epochs": 3,
            "log_every_steps": 1,
            "optimizer.learning_rate": 1e-3,
        },
    )
    _run(config, tmp_path / "student")
    soft = _soft_losses(tmp_path / "student")
    assert len(soft) >= 6 and soft[-1] < soft[0]
    model = bertjax.Model.load(tmp_path / "student")
    assert model.config.num_layers == 1
    assert "answer" in model.answer("the w1", "w3 w1 w2")


def test_embeddings_distil_towards_the_teachers_vectors(embedding_files, tmp_path):
    """A sentence-transformers teacher and its first layer as the student: the squared error
    to the teacher's embeddings falls, and the student embeds as an embedding run."""
    root = embedding_files
    rng = np.random.default_rng(1)
    (tmp_path / "train.tsv").write_text(
        "anchor\tpositive\n"
        + "".join(f"{a}\t{p}\n" for a, p in zip(*embedding_helpers.synthetic_pairs(rng, 64)))
    )
    (tmp_path / "more.tsv").write_text(
        "anchor\tpositive\n"
        + "".join(f"{a}\t{p}\n" for a, p in zip(*embedding_helpers.synthetic_pairs(rng, 16)))
    )
    config = finetune_recipe.get_config()
    config.update_from_flattened_dict(
        {
            "init_from": "",
            "task": "embedding",
            "data.train": str(tmp_path / "train.tsv"),
            "data.validation": str(root / "dev.tsv"),
            "data.text_fields": "anchor,positive",
            "data.label_field": "score",
            "data.max_seq_length": 16,
            "data.unlabeled": str(tmp_path / "more.tsv"),
            "distill.teacher": str(root / "source"),
            "distill.student_layers": "0",
            "distill.alpha": 1.0,
            "batch_size": 16,
            "eval_batch_size": 32,
            "num_epochs": 3,
            "log_every_steps": 1,
            "optimizer.learning_rate": 1e-3,
        }
    )
    _run(config, tmp_path / "student")
    soft = _soft_losses(tmp_path / "student")
    assert len(soft) >= 6 and soft[-1] < soft[0]
    model = bertjax.Model.load(tmp_path / "student")
    assert model.config.num_layers == 1 and model.embed(["w1 w2"]).shape == (1, 32)


def test_a_student_fine_tunes_further_as_any_run(teachers, tmp_path):
    """The distilled student is an ordinary run: init_from of another task's run."""
    root, made = teachers
    teacher, fields = made["classification"]
    config = _config(
        "", "classification", fields, **{"distill.teacher": teacher, "distill.student_layers": "0"}
    )
    _run(config, tmp_path / "student")
    _, regression = made["regression"]
    summary = _run(_config(tmp_path / "student", "regression", regression), tmp_path / "further")
    assert summary["seeds"][0]["best"] is not None


def test_a_teacher_files_and_run_on_gcs(teachers, gcs, tmp_path):
    """Teacher, training files and the work directory all on gs://: the student trains and
    its run opens from the bucket."""
    root, made = teachers
    teacher, fields = made["classification"]
    bucket = gcs.bucket()
    gcs.fs.put(teacher, bucket + "/teacher", recursive=True)
    for field in ("data.train", "data.validation"):
        name = pathlib.Path(fields[field]).name
        gcs.fs.put(fields[field], f"{bucket}/data/{name}")
    remote = {field: f"{bucket}/data/{pathlib.Path(path).name}" for field, path in fields.items()}
    gcs.fs.invalidate_cache()
    config = _config(
        "",
        "classification",
        remote,
        **{"distill.teacher": bucket + "/teacher", "distill.student_layers": "0"},
    )
    _run(config, bucket + "/student")
    model = bertjax.Model.load(bucket + "/student")
    assert model.config.num_layers == 1 and len(model.predict(["w1 w2"])) == 1


def test_the_glue_suite_takes_a_distilled_student_as_init_from(
    finetuned_run, pretrained_run, tmp_path
):
    """A student distilled from the session's topic classifier starts a GLUE suite's runs as
    any pretrained run does (its encoder taken, each task's head fresh)."""
    root, *_ = finetuned_run
    config = corpora.finetune_config(
        "",
        **{
            "task": "classification",
            "data.train": str(root / "train.csv"),
            "data.validation": str(root / "dev.csv"),
            "distill.teacher": str(root / "alone"),
            "distill.student_layers": "0",
            "num_epochs": 1,
        },
    )
    _run(config, tmp_path / "student")
    _, topics = pretrained_run
    data = glue_data.write_hub(tmp_path / "glue", topics, ("sst2",), train=32, dev=16, ax=False)
    suite_config = glue_recipe.get_config()
    suite_config.update_from_flattened_dict(
        {
            "init_from": str(tmp_path / "student"),
            "data_dir": str(data),
            "tasks": "sst2",
            "seeds": (1,),
            "sweep.learning_rate": (1e-3,),
            "finetune.batch_size": 16,
            "finetune.eval_batch_size": 32,
            "finetune.num_epochs": 1,
            "finetune.data.max_seq_length": 32,
        }
    )
    summary = suite.run_suite(SuiteSettings.from_config(suite_config), tmp_path / "suite")
    assert set(summary["report"]["tasks"]) == {"sst2"}
