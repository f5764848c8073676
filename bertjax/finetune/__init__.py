"""Fine-tuning the pretrained encoder on a task, a peer of the pretraining package over the engine.

    settings.py  the run's settings, read once from the config (configs/finetune.py)
    task.py      what a task is (the `Task` contract); each capability of bertjax.tasks
                 lists its tasks, which config.task names
    layouts.py   the formats read (CSV, TSV, JSON Lines, CoNLL), the splits' names
    glue_tasks.py  GLUE's tasks, one table: files, labels, metrics, the hub's layout, submission
    data.py      task files -> examples -> encoded arrays, with one-line input errors
    metrics.py   accuracy, F1, Matthews, Pearson/Spearman, entity-level scores
    objective.py build_finetuning: the engine's steps for a task's objective
    loop.py      the run: train, evaluate each epoch, keep the best, predict, several seeds
    prepared.py  the run made ready once for its seeds: init_from, data, steps, widths
    warm_start.py  the first train state from init_from, as the head's capability takes it
    batches.py   each epoch's order; training and evaluation batches cut to their widths
    widths.py    the few widths the run's batches are cut to; the token capacity
    evaluation.py  evaluation, validation scores by the task's metrics, test predictions
    resume.py    a checkpoint's meta, and whether it belongs to the run that would resume it
    ahead.py     the run's programs compiled ahead
    summary.py   the seeds' results, their median, the closing lines

`finetune.py` at the repository root is the command line. It knows no task by name.
"""
