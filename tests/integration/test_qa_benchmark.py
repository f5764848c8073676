"""benchmarks/qa.py's whole command: the inputs it writes for finetune.py, and the summary
line it reads back from finetune.py's output."""

import pytest

from bertjax.finetune import warm_start
from bertjax.tasks.qa import squad
from tests.helpers import benchmark_module

qa = benchmark_module.load("qa")


@pytest.mark.slow
def test_the_whole_command_s_inputs_open_and_read_as_finetune_py_reads_them(tmp_path):
    args = qa.parse_args(
        ["--preset=tiny", "--vocab_size=300", "--windows=40", "--batch_size=8"]
        + ["--max_seq_length=64", "--question_lengths=3,6", "--context_lengths=10,40"]
    )
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
def test_the_summary_line_is_read_back(capsys):
    summary = {
        "seeds": [{"seed": 0, "workdir": "runs/x", "best": None}],
        "preempted": False,
        "wall_time_sec": 95.4,
        "compile_sec": 85.1,
        "programs_compiled": 29,
        "programs_loaded": 2,
        "usage": "answer(...)",
    }
    summary.print_summary(summary)
    found = qa.SUMMARY.search(capsys.readouterr().out)
    assert found.groups() == ("95.4", "85.1", "29", "2")


@pytest.mark.slow
def test_the_torch_script_s_f1_decodes_context_spans_only(tmp_path):
    import transformers

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
    qa._squad_file(str(path), questions)
    # [CLS] who came [SEP] alpha beta gamma delta [SEP]: the context is tokens 4 to 7.
    starts, ends = qa.np.zeros((2, 16)), qa.np.zeros((2, 16))
    starts[0, 6] = ends[0, 6] = 10.0  # "gamma": right
    starts[1, 4] = ends[1, 5] = 10.0  # "alpha beta": wrong
    starts[1, 1] = ends[1, 1] = 100.0  # the question's "who": never an answer
    assert qa._hf_f1(*qa._hf_read(tokenizer, str(path), 16), starts, ends) == pytest.approx(50.0)
    ends[1, 7] = 20.0  # "alpha beta gamma delta": one token of four right, F1 0.4
    assert qa._hf_f1(*qa._hf_read(tokenizer, str(path), 16), starts, ends) == pytest.approx(70.0)


@pytest.mark.slow
def test_the_torch_script_s_dev_loss_is_finetune_py_s_eval_loss():
    import jax.numpy as jnp

    from bertjax.tasks.qa.model import qa_sums

    rng = qa.np.random.default_rng(0)
    mask = qa.np.ones((3, 8), qa.np.int32)
    mask[1, 5:] = mask[2, 3:] = 0
    starts = rng.normal(size=(3, 8)).astype(qa.np.float32)
    ends = rng.normal(size=(3, 8)).astype(qa.np.float32)
    positions = {"start_positions": qa.np.array([1, 4, 0]), "end_positions": qa.np.array([2, 4, 2])}
    ours = qa._span_loss({"input_mask": mask, **positions}, starts, ends)
    starts[1, 6] = -qa.np.inf  # past a batch's width: the script's fill, outside the real tokens
    assert qa._span_loss({"input_mask": mask, **positions}, starts, ends) == ours
    sums = qa_sums(
        jnp.asarray(qa.np.where(qa.np.isfinite(starts), starts, 0.0)),
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
    args = qa.parse_args(
        ["--preset=tiny", "--vocab_size=300", "--windows=40", "--batch_size=8"]
        + ["--max_seq_length=64", "--question_lengths=3,6", "--context_lengths=10,40"]
        + [f"--torch_head_init={head_init}"]
    )
    optimizer = qa.optim.OptimizerSettings(learning_rate=3e-5, warmup_steps=1, total_steps=5)
    side = qa.Transformers(args, qa.synthetic_windows(args), optimizer, "grouped")
    weight = side.model.qa_outputs.weight.detach().numpy()  # [2, 128]
    # google's truncated normal keeps every weight within two deviations (0.04); of 256
    # draws of a plain normal of 0.02, about 12 fall outside.
    assert (abs(weight).max() <= 0.04) == (head_init == "google")
    assert abs(weight.std() - 0.02) < 0.004 if head_init == "transformers" else weight.std() < 0.02
