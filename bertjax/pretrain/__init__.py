"""Pretraining (masked LM + next-sentence or sentence-order prediction), a peer of
the fine-tuning package over the engine (bertjax.steps, bertjax.loop).

    settings.py  the run's settings, read once from the config (configs/default.py)
    data.py      the run's prepared data: prepared on first use, checked against the settings
    objective.py what a step minimises, and build_pretraining (the engine's steps for it)
    loop.py      train_and_evaluate: the job behind train.py, and its end-of-run summary

`train.py` at the repository root is the command line.
"""
