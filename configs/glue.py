"""The GLUE suite with BERT's fine-tuning recipe:

    python evaluate.py --config configs/glue.py --workdir runs/glue-base \
        --config.init_from=runs/base --config.data_dir=glue/

BERT's recipe (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", section 4.1): batch size 32, 3 epochs over the task's data, and the
learning rate among 5e-5, 4e-5, 3e-5 and 2e-5 that does best on the dev set; the rest is
google-research/bert's run_classifier (AdamW with weight decay 0.01, warmup over the first
10 % of the steps, then linear decay, max_seq_length 128). Each configuration runs once per
seed and the table reports the best configuration's median over the seeds (the seeds are
this suite's choice: the paper does not fix them).

Every field of the fine-tuning config (configs/finetune.py) can be set for all runs
(--config.finetune.FIELD=...), swept (--config.sweep.learning_rate=5e-5,3e-5), or set per
task (config.per_task, see configs/glue_modernbert.py). docs/glue.md describes the rest.
"""

import ml_collections

from bertjax.finetune import glue_tasks
from configs import finetune


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The model to evaluate: a pretraining work directory (its newest checkpoint), a
    # fine-tuned one, or a transformers/ModernBERT directory; local or gs://. Required.
    config.init_from = ""
    # GLUE's tasks: CoLA/, SST-2/, ... as GLUE's download script writes them, or cola/,
    # sst2/, ... holding the hub's parquet files. A task that is not there is skipped.
    config.data_dir = ""
    # Which tasks run; WNLI (left out of every paper's table) only when listed.
    config.tasks = ",".join(glue_tasks.DEFAULT_TASKS)
    config.seeds = (1, 2, 3)
    # Each field's values tried, every combination, per task; a name is a field of
    # config.finetune, by its last name (learning_rate) or its dotted one.
    config.sweep = ml_collections.ConfigDict({"learning_rate": (5e-5, 4e-5, 3e-5, 2e-5)})
    # Per task: {"fields": {...}, "sweep": {...}, "start_from": "<task>"}; a task's sweep
    # entries replace config.sweep's of the same field.
    config.per_task = ml_collections.ConfigDict()
    # Pretraining checkpoints to compare ("1000,2000,3000", or "all" that init_from kept):
    # the curve_tasks run at each, and curve.png shows their scores against the step.
    config.steps = ""
    config.curve_tasks = "sst2,mrpc,stsb,rte"
    # Predict every task's test file with its chosen run: submission.zip for the GLUE server.
    config.submission = False

    config.finetune = finetune.get_config()
    config.finetune.batch_size = 32
    config.finetune.num_epochs = 3
    config.finetune.data.max_seq_length = 128
    return config
