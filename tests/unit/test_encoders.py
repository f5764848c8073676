"""Encoder families (bertjax.encoders): the registry and checkpoint meta, and ModernBERT under
the capabilities: each head's logits against transformers' ModernBert* classes in both
directions (our params -> Model.save_hf -> transformers; transformers' save_pretrained ->
Model.load -> ours), fill_mask, predict, answer and embed on ModernBERT directories, and a
BERT checkpoint whose meta names no family still opening."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import bertjax
from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir
from bertjax.nn import heads, sharding
from bertjax.storage import hf
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.task import head_for
from bertjax.tasks.seq2seq.options import TaskOptions
from tests.helpers.encoders import (
    ATOL,
    CONFIG,
    LABELS,
    SEQ,
    SMALL_BERT,
    SMALL_CONFIGS,
    TOKENIZER,
    _batch,
    _head_model,
)
from tests.helpers.params import max_diff, random_init, random_init_from_key

# ---------------------------------------------------------------------------------------------
# The registry and checkpoint meta.


def test_families_are_found_by_config_type_and_model_type():
    assert encoders.names() == ("bert", "modernbert", "electra")
    assert encoders.family_of(BertConfig()).name == "bert"
    assert encoders.family_of(CONFIG).name == "modernbert"
    assert encoders.for_model_type("modernbert") is encoders.family_of(CONFIG)
    assert encoders.for_model_type(None).name == "bert"  # config.json without model_type
    with pytest.raises(ValueError, match="model_type='roberta' is not supported"):
        encoders.for_model_type("roberta")
    with pytest.raises(ValueError, match="no encoder family's config"):
        encoders.family_of({"hidden_size": 8})


def test_every_registered_family_has_a_small_config_for_the_tests():
    assert tuple(SMALL_CONFIGS) == encoders.names()
    for name, config in SMALL_CONFIGS.items():
        assert encoders.family_of(config).name == name


@pytest.mark.parametrize("family", encoders.names())
def test_meta_records_the_family(family):
    config = SMALL_CONFIGS[family]
    d = encoders.config_to_dict(config)
    assert d[encoders.FAMILY_KEY] == family
    assert json.loads(json.dumps(d)) == d
    assert encoders.config_from_dict(d) == config


def test_old_meta_is_bert_and_unknown_fields_are_refused():
    # Checkpoints written before families record BertConfig.to_dict() alone.
    assert encoders.config_from_dict(SMALL_BERT.to_dict()) == SMALL_BERT
    with pytest.raises(ValueError, match="unknown ModernBertConfig fields"):
        encoders.config_from_dict({"family": "modernbert", "hidden_act": "gelu"})


def test_modernbert_encoder_ignores_segment_ids_and_keeps_its_head_under_bert():
    module = encoders.family_of(CONFIG).module(CONFIG)
    ids, mask = _batch()
    params = random_init(lambda: module.init(jax.random.key(0), ids, None, mask)["params"], 0)
    assert "head" in params and "layer_0" in params
    apply = jax.jit(module.apply)
    seq, pooled = apply({"params": params}, ids, None, mask)
    seq2, pooled2 = apply({"params": params}, ids, np.ones_like(ids), mask)
    assert seq.shape == (3, SEQ, 64) and pooled.shape == (3, 64)
    np.testing.assert_array_equal(seq, seq2)
    np.testing.assert_array_equal(pooled, pooled2)
    # A head adds only its dense layer beside the encoder's tree.
    head = HeadSpec("classification", LABELS)
    tree = jax.eval_shape(lambda: heads.init_params(_head_model(CONFIG, head), jax.random.key(0)))
    assert set(tree) == {"bert", "classifier"}


# ---------------------------------------------------------------------------------------------
# Parity of each head with transformers, both ways.


# ---------------------------------------------------------------------------------------------
# Checkpoints: meta with and without a family.


def _write_checkpoint(workdir, meta, params):
    """A run directory as fine-tuning leaves it: one step, its meta, the tokenizer beside."""
    TOKENIZER.save_hf(workdir)
    opt_state = {"count": jnp.zeros((), jnp.int32)}
    with checkpoint_lib.Checkpointer(workdir / rundir.CHECKPOINT_DIR, async_save=False) as ckpt:
        ckpt.save(1, params=params, opt_state=opt_state, meta=meta, force=True)


@pytest.mark.parametrize("family", ("bert-meta-without-family", *encoders.names()))
def test_finetuned_checkpoint_opens_with_its_family(family, tmp_path):
    config = SMALL_CONFIGS[family.split("-")[0]]
    head = HeadSpec("classification", LABELS)
    params = random_init_from_key(bertjax.capability.of(head).init(config, head), 6, std=0.1)
    # As fine-tuning writes meta, or BERT's without a family, as every checkpoint before them.
    if family == "bert-meta-without-family":
        model_config = config.to_dict()
    else:
        model_config = encoders.config_to_dict(config)
    meta = {
        "head": head.to_dict(),
        "model_config": model_config,
        "tokenizer_fingerprint": TOKENIZER.fingerprint,
    }
    _write_checkpoint(tmp_path, meta, params)
    model = bertjax.Model.load(tmp_path)
    assert model.config == config and model.head == head
    in_memory = bertjax.Model(config, params, TOKENIZER, head=head)
    texts = ["the king of france", "a small river in paris"]
    assert model.predict(texts) == in_memory.predict(texts)


# ---------------------------------------------------------------------------------------------
# Fine-tuning from a ModernBERT directory.


def test_seq2seq_refuses_a_modernbert_encoder():
    options = TaskOptions(decoder_start_id=TOKENIZER.cls_id, eos_id=TOKENIZER.sep_id)
    with pytest.raises(ValueError, match="seq2seq needs a BERT encoder; ModernBertConfig"):
        options.config(CONFIG)


def test_an_embedding_model_on_modernbert_embeds_and_exports_as_trained(tmp_path):
    spec = EmbeddingSpec(pooling="mean", normalize=True, max_seq_length=32)
    head = head_for(spec)
    params = random_init_from_key(bertjax.capability.of(head).init(CONFIG, head), 8, std=0.1)
    model = bertjax.Model(CONFIG, params, TOKENIZER, head=head)
    texts = ["the louvre is in paris", "a river"]
    vectors = model.embed(texts)
    plain = bertjax.Model(CONFIG, params, TOKENIZER).embed(texts, pooling="mean")
    expected = plain / np.linalg.norm(plain, axis=-1, keepdims=True)
    assert max_diff(vectors, expected) < ATOL
    # Exported as sentence-transformers over a ModernBertModel, and read back as trained.
    model.save_hf(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "ModernBertModel"
    ]
    reopened = bertjax.Model.load(tmp_path)
    assert isinstance(reopened.config, ModernBertConfig)
    assert max_diff(reopened.embed(texts), vectors) < ATOL


def test_resuming_checks_the_family_and_its_architecture_fields():
    meta = {"tokenizer_fingerprint": TOKENIZER.fingerprint}
    old = {**meta, "model_config": SMALL_BERT.to_dict()}  # no family: BERT
    rundir.check_compatible(old, TOKENIZER, SMALL_BERT, "the checkpoint")
    wider = SMALL_BERT.__class__(**{**SMALL_BERT.to_dict(), "hidden_size": 64})
    with pytest.raises(rundir.IncompatibleCheckpointError, match="hidden_size=32"):
        rundir.check_compatible(old, TOKENIZER, wider, "the checkpoint")
    modern = {**meta, "model_config": encoders.config_to_dict(CONFIG)}
    rundir.check_compatible(modern, TOKENIZER, CONFIG, "the checkpoint")
    with pytest.raises(rundir.IncompatibleCheckpointError, match="has a modernbert model"):
        rundir.check_compatible(modern, TOKENIZER, SMALL_BERT, "the checkpoint")
    windowed = encoders.config_from_dict({**modern["model_config"], "local_attention": 16})
    with pytest.raises(rundir.IncompatibleCheckpointError, match="local_attention=8"):
        rundir.check_compatible(modern, TOKENIZER, windowed, "the checkpoint")


@pytest.mark.parametrize("family", encoders.names())
def test_a_model_on_a_mesh_predicts_as_on_one_device(family):
    config = SMALL_CONFIGS[family]
    head = HeadSpec("classification", LABELS)
    params = random_init_from_key(bertjax.capability.of(head).init(config, head), 9, std=0.1)
    texts = ["the louvre is in paris", "a river", "the old king built a museum"]
    alone = bertjax.Model(config, params, TOKENIZER, head=head).predict(texts)
    mesh = sharding.make_mesh((2, 2, 2))
    spread = bertjax.Model(config, params, TOKENIZER, head=head, mesh=mesh).predict(texts)
    assert [p["label"] for p in spread] == [p["label"] for p in alone]
    assert max_diff([p["score"] for p in spread], [p["score"] for p in alone]) < ATOL


# ---------------------------------------------------------------------------------------------
# What a network built beside a family's encoder reads (a generator, a distillation's student).


@pytest.mark.parametrize("family", encoders.names())
def test_every_encoder_offers_its_embedded_tokens_word_table_and_hidden_states(family):
    config = SMALL_CONFIGS[family]
    fam = encoders.family_of(config)
    params = random_init_from_key(fam.pretraining_init(config), 0, std=0.1)
    ids, mask = _batch()
    positions = jnp.asarray([[1, 2]] * ids.shape[0], jnp.int32)  # [b, p]
    encoder = fam.module(config)

    @jax.jit
    def outputs(params):
        output = fam.pretraining_model(config).apply({"params": params}, ids, None, mask, positions)
        variables = {"params": params[capability.ENCODER]}
        sequence, _ = encoder.apply(variables, ids, None, mask)
        hidden = encoder.apply(variables, ids, None, mask, method="hidden_states")
        embedded = encoder.apply(variables, ids, method="embed")
        return output, sequence, hidden, embedded, encoder.apply(variables, method="word_table")

    output, sequence, hidden, embedded, table = outputs(params)
    real = mask > 0
    # The pretraining model's last hidden states are the encoder's, with or without its call.
    np.testing.assert_allclose(output.sequence_output[real], hidden[real], atol=ATOL)
    np.testing.assert_allclose(sequence[real], hidden[real], atol=ATOL)
    assert output.mlm_logits.shape == (*positions.shape, config.vocab_size)
    assert hidden.shape == (*ids.shape, config.hidden_size)
    # The embedded tokens are rows of the word table's width, which a tied decoder reads.
    assert table.shape[0] == config.vocab_size
    assert embedded.shape == (*ids.shape, table.shape[1])


# ---------------------------------------------------------------------------------------------
# Task heads: one object each (EncoderFamily.head), its module and its tensor map.


@pytest.mark.parametrize("reads", [capability.POOLED, capability.TOKENS])
@pytest.mark.parametrize("family", encoders.names())
def test_a_head_names_every_parameter_of_its_own_and_each_tensor_has_its_shape(family, reads):
    config = SMALL_CONFIGS[family]
    head = encoders.family_of(config).head(config, heads.CLASSIFIER, 3, reads)
    task = "classification" if reads == capability.POOLED else "token_classification"
    model = _head_model(config, HeadSpec(task, LABELS))
    flat = dict(
        hf.flatten_tree(
            nn.meta.unbox(jax.eval_shape(lambda: heads.init_params(model, jax.random.key(0))))
        )
    )
    # The module's parameters are the head's tensors outside the encoder, no more, no less.
    own = {path for path in flat if path[0] == heads.CLASSIFIER}
    assert own == {s.path for s in head.tensors if s.path[0] != capability.ENCODER}
    assert len({s.hf_name for s in head.tensors}) == len(head.tensors)
    for spec in head.tensors:
        assert flat[spec.path].shape == spec.shape, spec.hf_name
        array = np.arange(np.prod(spec.shape), dtype=np.float32).reshape(spec.shape)
        assert spec.to_hf(array).shape == spec.hf_shape
        np.testing.assert_array_equal(spec.to_bertjax(spec.to_hf(array)), array)


def test_electras_sequence_head_is_one_head_of_two_layers_in_transformers_names():
    config = SMALL_CONFIGS["electra"]
    h = config.hidden_size
    family = encoders.family_of(config)
    head = family.head(config, heads.CLASSIFIER, 3, capability.POOLED)
    assert [(s.hf_name, s.path, s.hf_shape) for s in head.tensors] == [
        ("classifier.dense.weight", (capability.ENCODER, "pooler", "kernel"), (h, h)),
        ("classifier.dense.bias", (capability.ENCODER, "pooler", "bias"), (h,)),
        ("classifier.out_proj.weight", (heads.CLASSIFIER, "kernel"), (3, h)),
        ("classifier.out_proj.bias", (heads.CLASSIFIER, "bias"), (3,)),
    ]
    tokens = encoders.family_of(config).head(config, "qa_outputs", 2, capability.TOKENS)
    assert [s.hf_name for s in tokens.tensors] == ["qa_outputs.weight", "qa_outputs.bias"]


def test_each_family_builds_its_replaced_token_head_or_says_it_has_none():
    described = capability.REPLACED_TOKENS
    args = (described.param, described.outputs, described.reads, described.task_class)
    config = SMALL_CONFIGS["electra"]
    h = config.hidden_size
    head = encoders.family_of(config).head(config, *args)
    assert [(s.hf_name, s.path, s.hf_shape) for s in head.tensors] == [
        (
            "discriminator_predictions.dense.weight",
            ("discriminator_head", "dense", "kernel"),
            (h, h),
        ),
        ("discriminator_predictions.dense.bias", ("discriminator_head", "dense", "bias"), (h,)),
        (
            "discriminator_predictions.dense_prediction.weight",
            ("discriminator_head", "dense_prediction", "kernel"),
            (1, h),
        ),
        (
            "discriminator_predictions.dense_prediction.bias",
            ("discriminator_head", "dense_prediction", "bias"),
            (1,),
        ),
    ]
    # The map ElectraForPreTraining directories are read and written with.
    assert set(head.tensors) <= set(encoders.family_of(config).pretraining_tensors(config))
    # ModernBERT builds one that no transformers class holds; BERT has none.
    config = SMALL_CONFIGS["modernbert"]
    assert encoders.family_of(config).head(config, *args).tensors == ()
    config = SMALL_CONFIGS["bert"]
    with pytest.raises(ValueError, match="BertForPreTraining has no replaced-token head"):
        encoders.family_of(config).head(config, *args)
