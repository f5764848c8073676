"""The encoder families' tests' shared vocabulary, tokenizer, small config and batches, the
heads of every capability, and the transformers side of their parity checks (torch and
transformers imported inside the functions that use them), and a hub-style directory."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from bertjax import encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.qa import model as qa_model
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.batches import padded_batch
from tests.helpers.tokenizer_kinds import pipeline_json

ATOL = 1e-5


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


WORDS = (
    "the a of to and in is it was for on that with as by at from his her they this which "
    "paris france capital city river seine museum louvre art history old new large small "
    "who what where when how many people live there built year king queen painting famous"
).split()


VOCAB = SPECIALS + WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]


VOCAB += [f"w{i}" for i in range(128 - len(VOCAB))]  # 128 rows: the model's vocabulary


TOKENIZER = WordPieceTokenizer(VOCAB, lowercase=True)


# hidden 64, 4 layers (0 and 3 global, 1 and 2 a window of +-4), 4 heads; float32.
CONFIG = ModernBertConfig(
    vocab_size=len(VOCAB),
    hidden_size=64,
    intermediate_size=96,
    num_layers=4,
    num_heads=4,
    max_position_embeddings=64,
    local_attention=8,
    global_attn_every_n_layers=3,
    global_rope_theta=1000.0,
    local_rope_theta=100.0,
    pad_token_id=TOKENIZER.pad_id,
    cls_token_id=TOKENIZER.cls_id,
    sep_token_id=TOKENIZER.sep_id,
    dtype="float32",
)

SMALL_BERT = BertConfig(
    vocab_size=len(VOCAB),
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
# A small config of every registered family over VOCAB, for the tests parametrised over the
# families (encoders.names()): registering a family and adding its line here covers it.
SMALL_CONFIGS = {
    "bert": SMALL_BERT,
    "modernbert": CONFIG,
    "electra": encoders.config_from_dict(
        {
            encoders.FAMILY_KEY: "electra",
            "vocab_size": len(VOCAB),
            "embedding_size": 16,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        }
    ),
}


SEQ = 24


LENGTHS = (SEQ, 17, 9)


LABELS = ("neg", "neutral", "pos")


TAGS = ("O", "B-LOC", "I-LOC", "B-PER")


def _batch(config=CONFIG, lengths=LENGTHS, seq=SEQ, seed=0):
    """(ids, mask) [len(lengths), seq]: [CLS], words, [SEP], then padding."""
    return padded_batch(
        lengths,
        seq,
        vocab_size=config.vocab_size,
        first_word=len(SPECIALS),
        cls_id=config.cls_token_id,
        sep_id=config.sep_token_id,
        pad_id=config.pad_token_id,
        seed=seed,
    )


def _torch():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers


def _run_torch(model, ids, mask):
    torch, _ = _torch()
    with torch.no_grad():
        return model(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()
        )


def _hf_model(cls_name, config, seed=0, **extra):
    """A transformers model with every parameter random (its own init zeroes biases and sets
    norms to one, which would hide a swapped bias or scale)."""
    _, transformers = _torch()
    hf_config = transformers.ModernBertConfig(
        **{**config.to_hf_dict(), **extra}, attn_implementation="eager"
    )
    model = getattr(transformers, cls_name)(hf_config)
    # Imported here: torch is for the parity tier, and the unit tier imports this module.
    from tests.helpers.torch_params import randomize_torch

    return randomize_torch(model, seed, 0.1)


def _head_model(config, head: HeadSpec):
    if head.task == qa_model.TASK:
        return qa_model.QuestionAnswering(config)
    return label_heads.make_model(config, head.task, head.num_outputs)


def _our_logits(config, head, params, ids, mask):
    model = _head_model(config, head)
    out = jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, None, mask))(
        params, ids, mask
    )
    if head.task == qa_model.TASK:
        return np.stack([np.asarray(out[0]), np.asarray(out[1])], axis=-1)  # [b, s, 2]
    return np.asarray(out)


def _torch_logits(model, head, ids, mask):
    out = _run_torch(model, ids, mask)
    if head.task == qa_model.TASK:
        return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], axis=-1)
    return out.logits.numpy()


# (HeadSpec, transformers class, pooling)
CASES = {
    "classification-cls": (HeadSpec("classification", LABELS), "SequenceClassification", "cls"),
    "classification-mean": (HeadSpec("classification", LABELS), "SequenceClassification", "mean"),
    "token-labels": (HeadSpec("token_classification", TAGS), "TokenClassification", "cls"),
    "qa": (HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS), "QuestionAnswering", "cls"),
}


TOPICS = (
    "paris france capital city river seine museum louvre".split(),
    "king queen painting famous history old year built".split(),
)


def _topic_csv(path, count, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        topic = int(rng.integers(2))
        words = rng.choice(TOPICS[topic], size=int(rng.integers(4, 9)))
        rows.append(f"{' '.join(words)},{('art', 'place')[topic]}")
    path.write_text("sentence,label\n" + "\n".join(rows) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Fine-tuning steps against transformers' ModernBert* classes trained by a plain torch loop, as
# tests/integration/test_finetune_hf_runs.py does for BERT's heads: the same random start (every
# parameter, norms and head included), the same batches, dropout off, AdamW with the decay mask
# (not on biases and norms), eps 1e-6, weight decay 0.01, clipping at global norm 1.0, linear
# warmup then decay, at 1e-3 so that any difference in the update shows. Question answering
# uses rows without padding: bertjax's span loss leaves padding positions out of the softmax,
# which transformers' does not (so their losses differ on padded rows;
# tests/unit/test_question_answering.py says why).
PARITY_STEPS, PARITY_BATCH, PARITY_LR = 20, 8, 1e-3  # 8 rows: one a simulated device


def _parity_batches(head: HeadSpec, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(PARITY_STEPS):
        full = head.task == qa_model.TASK
        lengths = np.full(PARITY_BATCH, SEQ) if full else rng.integers(6, SEQ + 1, PARITY_BATCH)
        ids, mask = _batch(lengths=tuple(int(n) for n in lengths), seed=int(rng.integers(1 << 30)))
        batch = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
        batch["weights"] = np.ones(PARITY_BATCH, np.float32)
        if head.task == label_heads.CLASSIFICATION:
            batch["labels"] = rng.integers(0, head.num_outputs, PARITY_BATCH).astype(np.int32)
        elif head.task == label_heads.TOKEN_CLASSIFICATION:
            labels = rng.integers(0, head.num_outputs, ids.shape).astype(np.int32)
            labels[mask == 0] = label_heads.IGNORE_LABEL
            batch["labels"] = labels
        else:
            starts = rng.integers(1, SEQ - 3, PARITY_BATCH)
            batch["start_positions"] = starts.astype(np.int32)
            batch["end_positions"] = (starts + rng.integers(0, 3, PARITY_BATCH)).astype(np.int32)
        batches.append(batch)
    return batches


def _torch_loss(reference, head: HeadSpec, batch):
    torch, _ = _torch()
    inputs = {
        "input_ids": torch.from_numpy(batch["input_ids"]).long(),
        "attention_mask": torch.from_numpy(batch["input_mask"]).long(),
    }
    if head.task == qa_model.TASK:
        inputs["start_positions"] = torch.from_numpy(batch["start_positions"]).long()
        inputs["end_positions"] = torch.from_numpy(batch["end_positions"]).long()
    else:  # transformers ignores -100
        labels = np.where(batch["labels"] == label_heads.IGNORE_LABEL, -100, batch["labels"])
        inputs["labels"] = torch.from_numpy(labels).long()
    return reference(**inputs).loss


# ---------------------------------------------------------------------------------------------
# A ModernBERT directory as the hub has it: a byte-level BPE tokenizer.json (no vocab.txt, no
# sentencepiece model) whose BERT-named special tokens come after the merged pieces, [MASK]
# taking the space before it, as answerdotai/ModernBERT-base's does.
HUB_TEXTS = [
    "The capital of France is Paris, on the river Seine.",
    "Paris has the Louvre, the largest art museum in the world.",
    "Who built the old bridge? The king built it in 1607.",
    "Many people live there; the city is large and old.",
] * 20


@pytest.fixture(scope="session")
def hub_dir(tmp_path_factory):
    """(directory, the transformers model): ModernBertForMaskedLM + a byte-level BPE tokenizer."""
    torch, transformers = _torch()
    directory = tmp_path_factory.mktemp("hub") / "modernbert"
    directory.mkdir()
    text = pipeline_json(400, HUB_TEXTS)
    (directory / "tokenizer.json").write_text(text)
    specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
    specials.update(mask_token="[MASK]", unk_token="[UNK]")
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **specials})
    )
    ids = json.loads(text)["added_tokens"]
    by_name = {t["content"]: t["id"] for t in ids}
    config = ModernBertConfig(
        **{
            **dataclasses.asdict(CONFIG),
            "vocab_size": max(by_name.values()) + 1,
            "pad_token_id": by_name["[PAD]"],
            "cls_token_id": by_name["[CLS]"],
            "sep_token_id": by_name["[SEP]"],
        }
    )
    theirs = _hf_model("ModernBertForMaskedLM", config, seed=11)
    with torch.no_grad():  # the decoder is tied: the noise drew it apart
        theirs.decoder.weight = theirs.model.embeddings.tok_embeddings.weight
    theirs.save_pretrained(directory)
    return directory, theirs
