"""The GLUE benchmark over fine-tuning: a suite of runs, its table, a curve, a submission.

GLUE's tasks (files, labels, metrics, the hub's layout, submission files) are one table,
bertjax.finetune.glue_tasks, which fine-tuning reads GLUE's files through.

    files.py       where a task's files are: GLUE's download layout, or the hub's parquet one
    settings.py    the suite's settings, read once from its config (configs/glue.py)
    suite.py       the sweep x seeds as fine-tuning runs, resumable, in one progress display
    results.py     medians over seeds, the best configuration, the GLUE average, results.md
    published.py   published rows (BERT, RoBERTa, ELECTRA, ModernBERT) with their sources
    curve.py       scores against pretraining step: curve.png and its table
    submission.py  the leaderboard's files (CoLA.tsv, ..., AX.tsv) and their zip

`evaluate.py` at the repository root is the command line; each run is one call of
bertjax.finetune.loop.finetune.
"""
