"""Question answering as a task: SQuAD-style JSON Lines, an exported model and its config."""

import dataclasses
import json

import jax
import numpy as np

from bertjax.encoders.bert import hf as bert_hf
from bertjax.tasks.qa import model as qa_model
from configs import finetune as finetune_config
from tests.helpers.question_answering import CONFIG, TOKENIZER, qa_head

ATOL = 1e-4


def write_jsonl(path, examples):
    """Examples in the JSON Lines layout of transformers' datasets."""
    lines = []
    for e in examples:
        answers = {
            "text": [a.text for a in e.answers],
            "answer_start": [a.start for a in e.answers],
        }
        record = {"id": e.id, "question": e.question, "context": e.context, "answers": answers}
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def random_export(directory, config=CONFIG, seed=0):
    """A random BertForQuestionAnswering directory with the test tokenizer."""
    model = qa_model.QuestionAnswering(config)
    init = jax.jit(lambda key: qa_model.init_params(model, key))
    params = jax.tree.map(np.asarray, init(jax.random.key(seed)))
    bert_hf.save(config, params, directory, tokenizer=TOKENIZER, head=qa_head())
    return str(directory)


def qa_config(init_from, train, validation, **overrides):
    config = finetune_config.get_config()
    config.init_from = init_from
    config.task = "question_answering"
    config.data.train = train
    config.data.validation = validation
    config.update_from_flattened_dict(overrides)
    return config


# A model wide enough to learn the synthetic task in a few hundred steps.
LEARNER = dataclasses.replace(CONFIG, hidden_size=64, intermediate_size=128)
