"""A distilled student, exported with save_hf, gives transformers its outputs (to 1e-4)."""

import numpy as np

import bertjax
from bertjax.encoders.bert import hf as bert_hf
from bertjax.finetune import loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.text.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_recipe
from tests.helpers.finetune_hf import CONFIG as TEACHER_CONFIG
from tests.helpers.finetune_hf import HEADS, random_params
from tests.helpers.finetune_hf_torch import assert_predicts_as_transformers


def test_a_distilled_classifier_exports_to_transformers_with_its_scores(tmp_path):
    words = [f"w{i}" for i in range(TEACHER_CONFIG.vocab_size - 5)]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    head = HEADS["classification"]
    bert_hf.save(TEACHER_CONFIG, random_params(head, 4), tmp_path / "teacher", tokenizer, head=head)
    rng = np.random.default_rng(0)
    for name, rows in (("train.csv", 32), ("dev.csv", 8)):
        lines = [f"{' '.join(rng.choice(words, 5))},{rng.choice(head.labels)}" for _ in range(rows)]
        (tmp_path / name).write_text("sentence,label\n" + "\n".join(lines) + "\n")
    config = finetune_recipe.get_config()
    config.update_from_flattened_dict(
        {
            "task": "classification",
            "data.train": str(tmp_path / "train.csv"),
            "data.validation": str(tmp_path / "dev.csv"),
            "data.max_seq_length": 16,
            "distill.teacher": str(tmp_path / "teacher"),
            "distill.student_layers": "1",
            "batch_size": 8,
            "eval_batch_size": 8,
            "num_epochs": 1,
            "optimizer.learning_rate": 1e-3,
        }
    )
    loop.finetune(FinetuneSettings.from_config(config), tmp_path / "student")

    model = bertjax.Model.load(tmp_path / "student")
    assert model.config.num_layers == 1
    model.save_hf(tmp_path / "export")
    texts = ["w1 w2 w3", "w40 w7 w8 w9", "w3"]
    predictions = model.predict(texts)
    reference = assert_predicts_as_transformers(tmp_path / "export", predictions, texts)
    assert reference.config.num_hidden_layers == 1
