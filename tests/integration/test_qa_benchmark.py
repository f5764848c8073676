"""benchmarks.qa's whole command: the inputs it writes for finetune.py, and its torch script's
F1, dev loss and head."""

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from benchmarks import qa
from bertjax.engine import optim
from bertjax.finetune import warm_start
from bertjax.tasks.qa import squad
from bertjax.tasks.qa.model import qa_sums

TINY = ["--preset=tiny", "--vocab_size=300", "--windows=40", "--batch_size=8"] + [
    "--max_seq_length=64",
    "--question_lengths=3,6",
    "--context_lengths=10,40",
]


@pytest.mark.slow
def test_the_whole_command_s_inputs_open_and_read_as_finetune_py_reads_them(tmp_path):
    args = qa.parse_args(TINY)
    init_from, train, dev = qa.command_inputs(args, str(tmp_path))
    source = warm_start.open_source(init_from)
    assert source.config.num_layers == 2 and source.config.vocab_size == 300
    for path, count in ((train, 40), (dev, 10)):
        data = squad.read_examples(path)
        assert len(data.examples) == count
        assert not data.mismatched  # every answer is the context's text at its start
        # One token per word: the lengths asked for.
        for example in data.examples[:5]:
            ids = source.tokenizer.encode_batch([example.question])[0]
            assert 3 <= len(ids) <= 6


@pytest.mark.slow
def test_the_torch_script_s_f1_decodes_context_spans_only(tmp_path):
    words = ["who", "came", "went", "alpha", "beta", "gamma", "delta"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab))
    context = "alpha beta gamma delta"
    questions = [
        ("q0", "who came", context, "gamma", 11),
        ("q1", "who went", context, "delta", 17),
    ]
    path = tmp_path / "dev.json"
    qa.squad_file(str(path), questions)
    # [CLS] who came [SEP] alpha beta gamma delta [SEP]: the context is tokens 4 to 7.
    starts, ends = np.zeros((2, 16)), np.zeros((2, 16))
    starts[0, 6] = ends[0, 6] = 10.0  # "gamma": right
    starts[1, 4] = ends[1, 5] = 10.0  # "alpha beta": wrong
    starts[1, 1] = ends[1, 1] = 100.0  # the question's "who": never an answer
    assert qa.hf_f1(*qa.hf_read(tokenizer, str(path), 16), starts, ends) == pytest.approx(50.0)
    ends[1, 7] = 20.0  # "alpha beta gamma delta": one token of four right, F1 0.4
    assert qa.hf_f1(*qa.hf_read(tokenizer, str(path), 16), starts, ends) == pytest.approx(70.0)


@pytest.mark.slow
def test_the_torch_script_s_dev_loss_is_finetune_py_s_eval_loss():
    rng = np.random.default_rng(0)
    mask = np.ones((3, 8), np.int32)
    mask[1, 5:] = mask[2, 3:] = 0
    starts = rng.normal(size=(3, 8)).astype(np.float32)
    ends = rng.normal(size=(3, 8)).astype(np.float32)
    positions = {"start_positions": np.array([1, 4, 0]), "end_positions": np.array([2, 4, 2])}
    ours = qa.span_loss({"input_mask": mask, **positions}, starts, ends)
    starts[1, 6] = -np.inf  # past a batch's width: the script's fill, outside the real tokens
    assert qa.span_loss({"input_mask": mask, **positions}, starts, ends) == ours
    sums = qa_sums(
        jnp.asarray(np.where(np.isfinite(starts), starts, 0.0)),
        jnp.asarray(ends),
        jnp.asarray(positions["start_positions"]),
        jnp.asarray(positions["end_positions"]),
        jnp.ones(3),
        jnp.asarray(mask),
    )
    assert ours == pytest.approx(float(sums.loss / sums.count), rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("head_init", ["transformers", "google"])
def test_the_torch_side_starts_its_head_as_asked(head_init):
    args = qa.parse_args(TINY + [f"--torch_head_init={head_init}"])
    optimizer = optim.OptimizerSettings(learning_rate=3e-5, warmup_steps=1, total_steps=5)
    side = qa.torch_side(args, qa.synthetic_windows(args), optimizer, "grouped")
    weight = side.model.qa_outputs.weight.detach().numpy()  # [2, 128]
    # google's truncated normal keeps every weight within two deviations (0.04); of 256
    # draws of a plain normal of 0.02, about 12 fall outside.
    assert (abs(weight).max() <= 0.04) == (head_init == "google")
    assert abs(weight.std() - 0.02) < 0.004 if head_init == "transformers" else weight.std() < 0.02


@pytest.mark.slow
def test_synthetic_windows_answer_inside_their_context():
    args = qa.parse_args(TINY)
    windows = qa.synthetic_windows(args)
    features = windows.features
    for row in range(len(windows)):
        context = np.flatnonzero(features["segment_ids"][row] & features["input_mask"][row])
        start, end = features["start_positions"][row], features["end_positions"][row]
        # The span lies within the context, before its closing [SEP], at most 5 tokens.
        assert context[0] <= start <= end < context[-1] and end - start < 5
