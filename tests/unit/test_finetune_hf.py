"""Fine-tuned models in and out of transformers' format: exports that load back whole, and
the helpers of tests/parity/test_finetune_hf_parity.py, where BertForSequenceClassification
and BertForTokenClassification give the same logits both ways."""

import jax
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from bertjax.capability import HeadSpec
from bertjax.encoders.bert import hf as bert_hf
from bertjax.engine import rundir
from bertjax.finetune import warm_start
from bertjax.storage import hf
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.finetune_hf import CONFIG, HEADS, random_params
from tests.helpers.finetuning import data_parallel_finetuning


def test_a_save_and_load_round_trip_keeps_every_parameter(tmp_path):
    head = HEADS["multi_label"]
    params = random_params(head, seed=2)
    bert_hf.save(CONFIG, params, tmp_path, head=head)
    config, loaded, report = bert_hf.load_with_report(tmp_path)
    assert report.head == head and config == CONFIG
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_a_classifier_checkpoint_without_its_classifier_is_refused(tmp_path):
    head = HEADS["classification"]
    bert_hf.save(CONFIG, random_params(head, seed=3), tmp_path, head=head)
    tensors = safetensors_numpy.load_file(tmp_path / hf.SAFE_WEIGHTS_NAME)
    del tensors["classifier.bias"]
    safetensors_numpy.save_file(tensors, tmp_path / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing tensor 'classifier.bias'"):
        bert_hf.load_with_report(tmp_path)


@pytest.mark.parametrize("same_task", [True, False])
def test_fine_tuning_from_a_transformers_classifier_keeps_its_head_for_the_same_task(
    tmp_path, same_task
):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "w"]) + "\n")
    head = HEADS["classification"]
    params = random_params(head, seed=5)
    bert_hf.save(
        CONFIG, params, tmp_path / "export", WordPieceTokenizer.from_vocab(vocab), head=head
    )
    source = warm_start.open_source(tmp_path / "export")
    assert source.kind == "hf" and source.head == head

    run_head = head if same_task else HeadSpec(label_heads.CLASSIFICATION, ("no", "yes"))
    ft = data_parallel_finetuning(CONFIG, run_head)
    fresh = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), ft.state.abstract.params)
    started, note, fresh_head = warm_start.initial_params(source, ft, fresh)
    assert fresh_head == (not same_task)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(started["bert"]), params["bert"])
    classifier = jax.device_get(started["classifier"])
    if same_task:
        jax.tree.map(np.testing.assert_array_equal, classifier, params["classifier"])
        assert "the encoder and the classification head" in note
    else:
        assert not classifier["kernel"].any()  # the run's own fresh head
        assert "is not this task's" in note


@pytest.mark.parametrize("same_task", [True, False])
def test_a_runs_first_state_is_the_source_over_its_own_initialisation(tmp_path, same_task):
    """first_state: the arrays initial_params gives over state.init(rng) (the source's
    encoder, its head or a fresh one, the fresh optimizer state), bit for bit, from a program
    without the encoder's random initialisation (fewer random bits drawn than init's)."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "w"]) + "\n")
    head = HEADS["classification"]
    bert_hf.save(
        CONFIG,
        random_params(head, seed=6),
        tmp_path / "export",
        WordPieceTokenizer.from_vocab(vocab),
        head=head,
    )
    source = warm_start.open_source(tmp_path / "export")
    run_head = head if same_task else HeadSpec(label_heads.CLASSIFICATION, ("no", "yes"))
    ft = data_parallel_finetuning(CONFIG, run_head)
    rng = jax.random.key(7)
    with jax.set_mesh(ft.mesh):
        state, note, fresh_head = warm_start.first_state(source, ft, rng)
        want = ft.state.init(rng)
        params, want_note, want_fresh_head = warm_start.initial_params(source, ft, want.params)
    assert (note, fresh_head) == (want_note, want_fresh_head)
    want = want.replace(params=params)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), jax.device_get(want))

    def random_bits(text):
        return text.count("rng_bit_generator") + text.count("threefry")

    init_hlo = jax.jit(ft.state.init).lower(rng).compile().as_text()
    assert random_bits(init_hlo) > 0
    _, given = rundir.read_params(source, ft.mesh)
    take = lambda given, fresh: {**fresh, "bert": given["bert"]}  # noqa: E731
    taking_hlo = (
        jax.jit(lambda rng, given: ft.state.init_taking(rng, given, take))
        .lower(rng, given)
        .compile()
        .as_text()
    )
    assert random_bits(taking_hlo) < random_bits(init_hlo)
