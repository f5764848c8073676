"""Fine-tuning with its programs compiled ahead in a background thread (compile_ahead=1) trains
the same parameters, bit for bit, as compiling each program when a step first meets its
shape: one batch per step, and micro-batches grouped by length; a finished run run again
compiles no training program; and a program that failed to compile in the background ends the
run with its error."""

import jax
import numpy as np
import pytest

from bertjax.engine import compile_ahead, rundir
from bertjax.finetune import loop
from bertjax.finetune.settings import FinetuneSettings
from tests.helpers.corpora import finetune_config as make_config
from tests.helpers.corpora import topic_task


@pytest.mark.slow  # two short runs each: about 30 s
@pytest.mark.parametrize("accumulate", [1, 4])
def test_compiling_ahead_trains_bit_identical_parameters(
    pretrained_run, tmp_path, monkeypatch, accumulate
):
    init_from, topics = pretrained_run
    fields = {
        **topic_task(tmp_path, topics, train=64, validation=24, test=8),
        "num_epochs": 2,
        "length_bucket": 4,  # sentences of 4 to 7 words: a few widths
        "grad_accum_steps": accumulate,
        "batch_size": 8 * accumulate,  # micro-batches of a row per simulated device
        "optimizer.learning_rate": 1e-3,
    }
    made = []
    ahead = compile_ahead.Compiler.ahead

    def recording(self, function):
        made.append(ahead(self, function))
        return made[-1]

    monkeypatch.setattr(compile_ahead.Compiler, "ahead", recording)
    runs = {}
    for threads in (0, 1):
        workdir = tmp_path / f"threads_{threads}"
        config = make_config(init_from, compile_ahead=threads, **fields)
        runs[threads] = (loop.finetune(FinetuneSettings.from_config(config), workdir), workdir)
    # The steps ran programs compiled ahead: every training shape and the evaluation's.
    served = {a.function.__name__: a.served for a in made}
    assert all(a.prepared() for a in made)
    train = "accumulate" if accumulate > 1 else "train_step"
    assert served[train] >= 8 and served["evaluate"] >= 2, served
    (plain, plain_dir), (early, early_dir) = runs[0], runs[1]
    assert plain["seeds"][0]["best"] == early["seeds"][0]["best"]
    for best in (True, False):  # the best parameters, and the last state's
        step, params = rundir.read_params(rundir.open_run(plain_dir, best=best))
        same_step, same_params = rundir.read_params(rundir.open_run(early_dir, best=best))
        assert step == same_step
        jax.tree.map(np.testing.assert_array_equal, params, same_params)
    predictions = "predictions_test.tsv"
    assert (plain_dir / predictions).read_text() == (early_dir / predictions).read_text()

    # Rerunning the finished run trains nothing, so it compiles no training program ahead;
    # its evaluation and predictions still run on programs compiled ahead.
    made.clear()
    config = make_config(init_from, compile_ahead=1, **fields)
    again = loop.finetune(FinetuneSettings.from_config(config), early_dir)
    assert again["seeds"][0]["best"] == early["seeds"][0]["best"]
    served = {a.function.__name__: a.served for a in made}
    assert served["evaluate"] >= 1 and not {"train_step", "accumulate"} & set(served), served


@pytest.mark.slow  # about 5 s
def test_a_failed_background_compile_ends_the_run_with_its_error(
    pretrained_run, tmp_path, monkeypatch
):
    init_from, topics = pretrained_run
    compile_program = compile_ahead.Compiler._compile

    def out_of_memory_for_evaluation(self, function, args):
        if function.__name__ == "evaluate":
            raise MemoryError("no room for the evaluation program")
        return compile_program(self, function, args)

    monkeypatch.setattr(compile_ahead.Compiler, "_compile", out_of_memory_for_evaluation)
    config = make_config(
        init_from,
        compile_ahead=1,
        num_epochs=1,
        **topic_task(tmp_path, topics, train=32, validation=8),
    )
    with pytest.raises(compile_ahead.CompileAheadError, match="evaluate.*no room") as info:
        loop.finetune(FinetuneSettings.from_config(config), tmp_path / "run")
    assert isinstance(info.value.__cause__, MemoryError)
