"""Pretraining (masked LM with or without next-sentence or sentence-order prediction, or
replaced-token detection), a peer of the fine-tuning package over the engine (bertjax.engine.steps,
bertjax.engine.loop).

    settings.py  the run's settings, read once from the config (configs/default.py)
    data.py      the run's prepared data: prepared on first use, checked against the settings
    objectives/  the registered objectives (mlm_sentence, mlm, rtd), each owning its checks,
                 parameters, loss, metrics, baselines, FLOPs, samples and exports
    objective.py build_pretraining: the engine's steps for the run's objective
    loop.py      train_and_evaluate: the job behind train.py, and its end-of-run summary

`train.py` at the repository root is the command line.
"""
