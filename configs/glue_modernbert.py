"""The GLUE suite with ModernBERT's per-task fine-tuning settings:

    python evaluate.py --config configs/glue_modernbert.py --workdir runs/glue-modernbert \
        --config.init_from=ModernBERT-base --config.data_dir=glue/

Read from ModernBERT's repository (github.com/AnswerDotAI/ModernBERT, commit 8c57a0f):
src/evals/glue_jobs.py gives each task's learning rate, weight decay, epochs and batch size
(the defaults of its MNLIJob, RTEJob, ... classes: DecoupledAdamW with betas (0.9, 0.98),
eps 1e-6, max_sequence_length 256), and glue.py runs MNLI first and starts RTE, MRPC and
STS-B from the MNLI checkpoint (as RoBERTa and DeBERTa do). Warmup is 6 % of the run
(yamls/finetuning/glue/mosaic-bert-base-uncased.yaml: t_warmup 0.06dur, linear decay to 0).

Composer's DecoupledAdamW multiplies every weight by (1 - weight_decay) per step along the
schedule, not by (1 - learning_rate * weight_decay) as AdamW (optax, here) does; the same
decay is weight_decay / learning_rate here, which is what the sweep below holds (MNLI: 1e-6
at 5e-5 is 0.02). bertjax keeps BERT's decay mask (no decay of biases and LayerNorm).

The paper (Warner et al. 2024, arXiv 2412.13663) tunes these per task over a sweep of
learning rate, weight decay and epochs; its grid is not reproduced here, so each task's sweep
holds the repository's one value. Widen it per task, e.g.
--config.per_task.rte.sweep.learning_rate=1e-5,3e-5 (or edit the dicts below).
"""

import ml_collections

from configs import glue

# task: (learning rate, weight decay, epochs, batch size), src/evals/glue_jobs.py.
MODERNBERT_JOBS = {
    "mnli": (5e-5, 1e-6, 2, 64),
    "rte": (1e-5, 1e-5, 3, 16),
    "qqp": (3e-5, 3e-6, 5, 16),
    "cola": (5e-5, 5e-6, 10, 32),
    "mrpc": (8e-5, 8e-6, 10, 32),
    "qnli": (1e-5, 1e-6, 10, 16),
    "sst2": (3e-5, 3e-6, 3, 16),
    "stsb": (3e-5, 3e-6, 10, 32),
}
# glue.py: the second round starts these from the MNLI checkpoint.
FROM_MNLI = ("rte", "mrpc", "stsb")


def get_config() -> ml_collections.ConfigDict:
    config = glue.get_config()
    config.sweep = ml_collections.ConfigDict()
    config.finetune.data.max_seq_length = 256
    config.finetune.optimizer.b2 = 0.98
    config.finetune.optimizer.eps = 1e-6
    config.finetune.optimizer.warmup_fraction = 0.06
    per_task = {}
    for task, (learning_rate, weight_decay, epochs, batch_size) in MODERNBERT_JOBS.items():
        per_task[task] = {
            "fields": {"batch_size": batch_size},
            "sweep": {
                "learning_rate": (learning_rate,),
                # Composer's decoupled decay as AdamW's (see the module docstring).
                "weight_decay": (weight_decay / learning_rate,),
                "num_epochs": (epochs,),
            },
            "start_from": "mnli" if task in FROM_MNLI else "",
        }
    config.per_task = ml_collections.ConfigDict(per_task)
    return config
