"""Fine-tuning the pretrained encoder on classification, sentence-pair, regression,
multi-label and token-labelling tasks.

    layouts.py   the formats read (CSV, TSV, JSON Lines, CoNLL) and GLUE's files
    data.py      task files -> examples -> encoded arrays, with one-line input errors
    metrics.py   accuracy, F1, Matthews, Pearson/Spearman, entity-level scores
    objective.py what a fine-tuning step minimises (a steps.Objective per head)
    loop.py      the run: train, evaluate each epoch, keep the best, predict, several seeds

`finetune.py` at the repository root is the command line; `bertjax.heads` holds the heads.
This package's modules are imported by name (nothing is imported here), so that
`bertjax.settings` can read the layouts without loading the training loop.
"""
