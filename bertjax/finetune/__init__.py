"""Fine-tuning the pretrained encoder on a task, a peer of the pretraining package over the engine.

    settings.py  the run's settings, read once from the config (configs/finetune.py)
    task.py      what a task is (the `Task` contract); each capability of bertjax.tasks
                 lists its tasks, which config.task names
    layouts.py   the formats read (CSV, TSV, JSON Lines, CoNLL) and GLUE's files
    data.py      task files -> examples -> encoded arrays, with one-line input errors
    metrics.py   accuracy, F1, Matthews, Pearson/Spearman, entity-level scores
    objective.py build_finetuning: the engine's steps for a task's objective
    loop.py      the run: train, evaluate each epoch, keep the best, predict, several seeds

`finetune.py` at the repository root is the command line. It knows no task by name.
"""
