"""The ELECTRA family in runs: its encoder's modes against its plain call, a classifier on a
mesh, fine-tuning from a transformers ELECTRA discriminator directory (config.init_from), and
fine-tuning steps against transformers' ElectraForSequenceClassification trained by a plain
torch loop."""

import dataclasses

import jax
import numpy as np
import pytest

import bertjax
from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.electra import hf as electra_hf
from bertjax.encoders.electra import model as electra_model
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import optim, rundir
from bertjax.finetune import loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.nn import sharding
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.batches import padded_batch
from tests.helpers.corpora import finetune_config
from tests.helpers.finetune_hf_torch import TORCH_WARMUP_STEPS, torch_adamw
from tests.helpers.finetuning import data_parallel_finetuning
from tests.helpers.params import random_init_from_key

ATOL = 1e-5
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOPICS = (
    "paris france capital city river seine museum louvre art".split(),
    "king queen painting famous history old year built".split(),
)
VOCAB = SPECIALS + TOPICS[0] + TOPICS[1]
VOCAB += [f"w{i}" for i in range(48 - len(VOCAB))]
TOKENIZER = WordPieceTokenizer(VOCAB, lowercase=True)
# Embeddings 8 wide projected to 16; dropout off, so that training steps are comparable.
CONFIG = ElectraConfig(
    vocab_size=len(VOCAB),
    embedding_size=8,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=24,
    max_position_embeddings=32,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
LABELS = ("a", "b", "c")
SEQ = 12


def _batch(lengths=(10, 7, 4, 10), seed=0):
    return padded_batch(
        lengths,
        SEQ,
        vocab_size=len(VOCAB),
        first_word=5,
        cls_id=TOKENIZER.cls_id,
        sep_id=TOKENIZER.sep_id,
        seed=seed,
    )


def _hf_model(cls_name, seed, **extra):
    """A transformers model of CONFIG with every parameter random."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.ElectraConfig(
        **{**electra_hf.config_to_hf(CONFIG, cls_name), **extra}, attn_implementation="eager"
    )
    model = getattr(transformers, cls_name)(hf_config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            p.copy_((1.0 + noise) if "LayerNorm.weight" in name else noise)
    return model


def _topic_csv(path, count, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        topic = int(rng.integers(2))
        words = rng.choice(TOPICS[topic], size=int(rng.integers(4, 9)))
        rows.append(f"{' '.join(words)},{('place', 'art')[topic]}")
    path.write_text("sentence,label\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.slow
def test_packed_tokens_cls_only_and_scanned_layers_match_the_plain_encoder():
    module = electra_model.ElectraEncoder(CONFIG)
    ids, mask = _batch()
    segments = (np.arange(SEQ)[None] >= 5).astype(np.int32) * mask
    params = random_init_from_key(
        lambda rng: module.init(rng, ids, segments, mask)["params"], seed=0, std=0.1
    )
    assert set(params) == {"embeddings", "embeddings_project", "encoder", "pooler"}
    assert params["embeddings"]["word_embeddings"]["embedding"].shape == (len(VOCAB), 8)
    seq, pooled = module.apply({"params": params}, ids, segments, mask)
    assert seq.shape == (4, SEQ, 16) and pooled.shape == (4, 16)

    packed, packed_pooled = module.apply({"params": params}, ids, segments, mask, packed_length=40)
    np.testing.assert_allclose(packed[mask == 1], seq[mask == 1], atol=ATOL)
    np.testing.assert_allclose(packed_pooled, pooled, atol=ATOL)
    first, first_pooled = module.apply({"params": params}, ids, segments, mask, cls_only=True)
    np.testing.assert_allclose(first[:, 0], seq[:, 0], atol=ATOL)
    np.testing.assert_allclose(first_pooled, pooled, atol=ATOL)
    # Segment ids are read (token-type embeddings), unlike ModernBERT's.
    other = module.apply({"params": params}, ids, np.zeros_like(ids), mask)[0]
    assert np.abs(np.asarray(other) - np.asarray(seq)).max() > 1e-3

    scanned = dataclasses.replace(CONFIG, scan_layers=True)
    stacked = model_lib.stack_layers(params, CONFIG.num_layers)
    again = electra_model.ElectraEncoder(scanned).apply({"params": stacked}, ids, segments, mask)
    np.testing.assert_allclose(again[0], seq, atol=ATOL)


@pytest.mark.slow
def test_an_electra_directory_on_a_mesh_predicts_as_on_one_device(tmp_path):
    head = HeadSpec(label_heads.CLASSIFICATION, LABELS)
    params = random_init_from_key(capability.of(head).init(CONFIG, head), seed=4, std=0.1)
    encoders.family_of(CONFIG).write_transformers(
        CONFIG, params, tmp_path, tokenizer=TOKENIZER, head=head
    )
    texts = ["paris art museum", "king", "old queen painting built year"]
    alone = bertjax.Model.load(tmp_path).predict(texts)
    spread = bertjax.Model.load(tmp_path, mesh=sharding.make_mesh((2, 2, 2))).predict(texts)
    assert [p["label"] for p in spread] == [p["label"] for p in alone]
    np.testing.assert_allclose([p["score"] for p in spread], [p["score"] for p in alone], atol=ATOL)


@pytest.mark.slow
def test_finetuning_classification_from_an_electra_discriminator_directory(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    # The classification head's two layers start fresh at initializer_range: at 16 hidden
    # units 0.02 (ELECTRA's) leaves their product's gradient too small to move in 24 steps.
    _hf_model("ElectraForPreTraining", seed=7, initializer_range=0.2).save_pretrained(
        tmp_path / "init"
    )
    TOKENIZER.save_hf(tmp_path / "init")
    config = finetune_config(
        tmp_path / "init",
        task="classification",
        **{
            "data.train": str(_topic_csv(tmp_path / "train.csv", 128, seed=1)),
            "data.validation": str(_topic_csv(tmp_path / "dev.csv", 32, seed=2)),
            "num_epochs": 4,
            "optimizer.learning_rate": 3e-3,
        },
    )
    loop.finetune(FinetuneSettings.from_config(config), tmp_path / "run")
    meta = checkpoint_lib.read_meta(tmp_path / "run" / rundir.BEST_CHECKPOINT_DIR)
    assert meta["model_config"][encoders.FAMILY_KEY] == "electra"
    model = bertjax.Model.load(tmp_path / "run")
    assert encoders.family_of(model.config).name == "electra"
    texts = ["paris river museum", "king painting history"]
    assert [p["label"] for p in model.predict(texts)] == ["place", "art"]
    # The fine-tuned model travels to transformers with the same logits.
    model.save_hf(tmp_path / "export")
    exported = transformers.ElectraForSequenceClassification.from_pretrained(
        tmp_path / "export", attn_implementation="eager"
    ).eval()
    ids, mask = _batch()
    ours = label_heads.make_model(model.config, model.head.task, 2).apply(
        {"params": model.params}, ids, None, mask
    )
    with torch.no_grad():
        theirs = exported(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()
        ).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=ATOL)


# Fine-tuning steps against transformers' ElectraForSequenceClassification trained by a plain
# torch loop, as tests/integration/test_finetune_hf_runs.py does for BERT's heads: the same
# random start (every parameter, norms and both layers of the head included), the same
# batches, dropout off, AdamW with the decay mask (not on biases and norms), eps 1e-6, weight
# decay 0.01, clipping at global norm 1.0, linear warmup then decay, at 1e-3 so that any
# difference in the update shows.
PARITY_STEPS, PARITY_BATCH, PARITY_LR = 20, 8, 1e-3  # 8 rows: one a simulated device


@pytest.mark.slow
def test_classification_steps_equal_transformers_step_for_step(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    head = HeadSpec(label_heads.CLASSIFICATION, LABELS)
    reference = _hf_model(
        "ElectraForSequenceClassification", seed=8, id2label=dict(enumerate(LABELS))
    )
    reference.save_pretrained(tmp_path / "start")
    reference.train()
    config, params, read_head, fresh = encoders.read_transformers(tmp_path / "start")
    assert read_head == head and fresh == ()

    torch_optimizer, schedule = torch_adamw(
        reference, PARITY_STEPS, PARITY_LR, no_decay=("bias", "LayerNorm")
    )
    settings = optim.OptimizerSettings(
        learning_rate=PARITY_LR, warmup_steps=TORCH_WARMUP_STEPS, total_steps=PARITY_STEPS
    )
    ft = data_parallel_finetuning(config, read_head, settings, batch=PARITY_BATCH, seq=SEQ)
    state = ft.state.init(jax.random.key(0))
    state = state.replace(params=jax.device_put(params, ft.state.shardings.params))
    rng = np.random.default_rng(0)
    for step in range(PARITY_STEPS):
        lengths = tuple(int(n) for n in rng.integers(4, SEQ + 1, PARITY_BATCH))
        ids, mask = _batch(lengths, seed=step)
        labels = rng.integers(0, len(LABELS), PARITY_BATCH).astype(np.int32)
        batch = {
            "input_ids": ids,
            "input_mask": mask,
            "segment_ids": np.zeros_like(ids),
            "labels": labels,
            "weights": np.ones(PARITY_BATCH, np.float32),
        }
        state, metrics = ft.train_step(
            state, jax.device_put(batch, ft.batch_sharding), jax.random.key(1)
        )
        loss = reference(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            labels=torch.from_numpy(labels).long(),
        ).loss
        torch_optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        torch_optimizer.step()
        schedule.step()
        message = f"step {step + 1}"
        np.testing.assert_allclose(float(metrics["train/loss"]), loss.item(), 1e-4, 0, message)
        np.testing.assert_allclose(
            float(metrics["train/grad_norm"]), grad_norm.item(), 1e-4, 0, message
        )

    encoders.family_of(config).write_transformers(
        config, jax.device_get(state.params), tmp_path / "ours", head=head
    )
    cls = transformers.ElectraForSequenceClassification
    ours = cls.from_pretrained(tmp_path / "ours", attn_implementation="eager").state_dict()
    start = cls.from_pretrained(tmp_path / "start", attn_implementation="eager").state_dict()
    theirs = reference.state_dict()
    # The steps moved the parameters far past the tolerance: agreement is not standing still.
    assert max(float((theirs[k] - start[k]).abs().max()) for k in ours) > 5e-3
    for key, value in ours.items():
        np.testing.assert_allclose(
            value.numpy(), theirs[key].detach().numpy(), atol=1e-4, rtol=0, err_msg=key
        )
