"""Every capability on the user's road: the literal finetune.py command, then a fresh Python
process that opens the run as a notebook does (one device, and a mesh of 8 simulated devices
giving the same answers) and exports it, and the export opened with transformers or
sentence-transformers (in the test's own process, which has them imported already); then a
second run on 8 devices (in the test's process: the claim is not about a fresh one) starts
from the first and keeps its head. One notebook process opens every capability's run.

One road per registered capability: a capability registered without one fails
`test_every_capability_has_a_road`.
"""

import dataclasses
import json
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import transformers

from bertjax import capability
from bertjax.finetune import loop as finetune_loop
from bertjax.finetune.settings import FinetuneSettings
from configs import finetune as finetune_recipe
from tests.helpers.corpora import LABELS, sentences, write_topic_csv
from tests.helpers.xla_env import REPO, subprocess_env

pytestmark = pytest.mark.slow


@dataclasses.dataclass(frozen=True)
class Road:
    """One capability's road: its data, command-line flags and notebook call."""

    task: str
    write: object  # (directory, topics) -> config fields naming the files written there
    call: str  # the notebook call, on `m`, as Python source
    export: object  # path -> what the export holds, opened the ecosystem's way
    kept: str  # what the init_from run says it took from the first run


def _sentence_transformer(path: str):
    import sentence_transformers  # 6-10 s to import: only where a test opens one

    return sentence_transformers.SentenceTransformer(path, device="cpu")


def _classification(directory: pathlib.Path, topics) -> dict[str, Any]:
    train = write_topic_csv(directory / "train.csv", topics, 64, seed=1)
    dev = write_topic_csv(directory / "dev.csv", topics, 16, seed=2)
    return {"data.train": str(train), "data.validation": str(dev)}


def _question_answering(directory: pathlib.Path, topics) -> dict[str, Any]:
    """Questions "which sport" over a context naming one word of an odd topic among even
    topics' words: the answer is that word."""
    rng = np.random.default_rng(3)
    for name, count in (("train", 48), ("dev", 8)):
        lines = []
        for k, (_, words) in enumerate(sentences(topics, count, seed=count, choose=[0, 2])):
            answer = str(rng.choice(topics[1]))
            where = int(rng.integers(0, len(words)))
            words = [*words[:where], answer, *words[where:]]
            context = " ".join(words)
            start = len(" ".join(words[:where])) + (1 if where else 0)
            record = {
                "id": f"{name}{k}",
                "question": f"which {LABELS[1]}",
                "context": context,
                "answers": {"text": [answer], "answer_start": [start]},
            }
            lines.append(json.dumps(record))
        (directory / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return {
        "data.train": str(directory / "train.jsonl"),
        "data.validation": str(directory / "dev.jsonl"),
        "data.max_seq_length": 32,
        "qa.doc_stride": 8,
        "qa.max_query_length": 8,
    }


def _embedding(directory: pathlib.Path, topics) -> dict[str, Any]:
    """Pairs of sentences of one topic; scored pairs (1 same topic, 0 not) to validate."""
    pairs = sentences(topics, 128, seed=4)
    train = ["anchor\tpositive"]
    train += [f"{' '.join(a[1])}\t{' '.join(b[1])}" for a, b in zip(pairs[::2], pairs[1::2])]
    (directory / "train.tsv").write_text("\n".join(train) + "\n")
    scored = sentences(topics, 32, seed=5)
    dev = ["anchor\tpositive\tscore"]
    dev += [
        f"{' '.join(a[1])}\t{' '.join(b[1])}\t{int(a[0] == b[0])}"
        for a, b in zip(scored[::2], scored[1::2])
    ]
    (directory / "dev.tsv").write_text("\n".join(dev) + "\n")
    return {
        "data.train": str(directory / "train.tsv"),
        "data.validation": str(directory / "dev.tsv"),
        "data.text_fields": "anchor,positive",
        "data.label_field": "score",
        "data.max_seq_length": 16,
    }


def _seq2seq(directory: pathlib.Path, topics) -> dict[str, Any]:
    """Each sentence's words reversed."""
    for name, count, seed in (("train", 64, 6), ("dev", 8, 7)):
        rows = ["source\ttarget"]
        rows += [f"{' '.join(w)}\t{' '.join(w[::-1])}" for _, w in sentences(topics, count, seed)]
        (directory / f"{name}.tsv").write_text("\n".join(rows) + "\n")
    return {
        "data.train": str(directory / "train.tsv"),
        "data.validation": str(directory / "dev.tsv"),
        "data.max_seq_length": 12,
        "data.max_target_length": 12,
        "seq2seq.max_new_tokens": 6,
    }


ROADS = {
    "classification": Road(
        "classification",
        _classification,
        'm.predict(["{w0} {w1} {w2}", "{w3} {w4}"])',
        lambda path: sorted(
            transformers.AutoModelForSequenceClassification.from_pretrained(
                path
            ).config.id2label.values()
        ),
        "Initialised the encoder and the classification head",
    ),
    "question_answering": Road(
        "question_answering",
        _question_answering,
        'm.answer(["which sports", "which sports"], ["{w0} {s0} {w1}", "{w2} {w3} {s1}"])',
        lambda path: (
            type(transformers.AutoModelForQuestionAnswering.from_pretrained(path)).__name__
        ),
        "Initialised the encoder and the question_answering head",
    ),
    "embedding": Road(
        "embedding",
        _embedding,
        'm.embed(["{w0} {w1}", "{w2}"]).tolist(), m.search(["{w0}"], ["{w1} {w0}", "{s0}"])',
        lambda path: _sentence_transformer(path).encode(["a b"]).shape,
        "Initialised the encoder from",
    ),
    "seq2seq": Road(
        "seq2seq",
        _seq2seq,
        'm.generate(["{w0} {w1} {w2}"], num_beams=1, max_new_tokens=4)',
        lambda path: type(transformers.EncoderDecoderModel.from_pretrained(path)).__name__,
        "Initialised the encoder-decoder from",
    ),
}

# The road's second half, in one fresh process for every capability: open each run, call
# its method on one device and on a mesh of 8, and export it.
NOTEBOOK = """
import json, sys
import jax, numpy as np
import bertjax
from bertjax.nn import sharding

results = {}
for task, run, call, path in json.loads(sys.argv[1]):
    m = bertjax.Model.load(run)
    one = eval(call, {"m": m})
    mesh = sharding.make_mesh((2, 2, 2))
    m = bertjax.Model.load(run, mesh=mesh)
    eight = eval(call, {"m": m})
    m.save_hf(path)
    results[task] = {"one": one, "eight": eight, "head": m.head.task}
print("RESULT " + json.dumps(results))
"""
# The same fine-tuning for every road: a batch of 8, one epoch.
FINETUNE = {"batch_size": 8, "eval_batch_size": 8, "num_epochs": 1}


def _run(args: list[str], devices: int, timeout: int = 600) -> subprocess.CompletedProcess:
    process = subprocess.run(
        args, capture_output=True, text=True, env=subprocess_env(devices), timeout=timeout
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return process


def _fields(init_from, road: Road, data: dict[str, Any]) -> dict[str, Any]:
    return {"init_from": str(init_from), "task": road.task, **FINETUNE, **data}


def _words(topics) -> dict[str, str]:
    words = {f"w{k}": w for k, w in enumerate(topics[0][:5])}
    words.update({f"s{k}": w for k, w in enumerate(topics[1][:2])})
    return words


@pytest.fixture(scope="module")
def roads(pretrained_run, tmp_path_factory):
    """task -> (directory, data fields, the command's output, the notebook's results): each
    road's literal finetune.py command on one device, then one notebook process for all."""
    source, topics = pretrained_run
    made = {}
    for task, road in ROADS.items():
        directory = tmp_path_factory.mktemp(task)
        data = road.write(directory, topics)
        flags = [f"--config.{name}={value}" for name, value in _fields(source, road, data).items()]
        command = [sys.executable, str(REPO / "finetune.py"), f"--workdir={directory / 'run'}"]
        made[task] = (directory, data, _run(command + flags, devices=1).stdout)
    calls = [
        (
            task,
            str(directory / "run"),
            ROADS[task].call.format(**_words(topics)),
            str(directory / "export"),
        )
        for task, (directory, _, _) in made.items()
    ]
    notebook = _run([sys.executable, "-c", NOTEBOOK, json.dumps(calls)], devices=8)
    lines = notebook.stdout.splitlines()
    results = json.loads(next(line for line in lines if line.startswith("RESULT "))[7:])
    return {task: (*made[task], results[task]) for task in made}


def _close(a, b) -> bool:
    """Equal structures, numbers within float rounding of another batch layout."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return abs(a - b) <= 1e-4 + 1e-3 * abs(b)
    return a == b


def test_every_capability_has_a_road():
    covered = {capability.get(task) for task in ROADS}
    registered = {capability.get(task) for task in capability.task_names()}
    assert registered == covered


@pytest.mark.parametrize("task", ROADS)
def test_the_users_road(task, roads, tmp_path, capsys):
    directory, data, output, result = roads[task]
    road = ROADS[task]
    # The end-of-run summary names the method that fits this kind of run.
    assert f".{capability.get(task).usage}" in output, output[-2000:]
    assert result["head"] == task
    assert _close(result["one"], result["eight"]), result
    expected = {
        "classification": sorted(LABELS),
        "question_answering": "BertForQuestionAnswering",
        "seq2seq": "EncoderDecoderModel",
    }
    if task == "embedding":  # as wide as the run's own embeddings
        expected[task] = (1, len(result["one"][0][0]))
    assert road.export(str(directory / "export")) == expected[task]

    # A second run on 8 devices starts from the first and keeps what it learned.
    config = finetune_recipe.get_config()
    config.update_from_flattened_dict(_fields(directory / "run", road, data))
    capsys.readouterr()
    finetune_loop.finetune(FinetuneSettings.from_config(config), str(tmp_path / "again"))
    second = capsys.readouterr().out
    assert road.kept in second, second[-2000:]
    assert "starts fresh" not in second
