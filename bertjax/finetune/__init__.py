"""Fine-tuning the pretrained encoder on a task, a peer of the pretraining package over the engine.

    settings.py  the run's settings, read once from the config (configs/finetune.py)
    task.py      what a task is (the `Task` contract) and the registry config.task names
    tasks/       the tasks, one module each registering its own (the heads of
                 bertjax.heads: classification, regression, multi_label,
                 token_classification)
    layouts.py   the formats read (CSV, TSV, JSON Lines, CoNLL) and GLUE's files
    data.py      task files -> examples -> encoded arrays, with one-line input errors
    metrics.py   accuracy, F1, Matthews, Pearson/Spearman, entity-level scores
    objective.py the heads' objective and build_finetuning (the engine's steps for a task)
    loop.py      the run: train, evaluate each epoch, keep the best, predict, several seeds

`finetune.py` at the repository root is the command line. Importing this package registers
every task.
"""

from bertjax.finetune import tasks  # noqa: F401  (registers every task)
