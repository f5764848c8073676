"""CPU demo of pretraining distillation: the tiny BERT demo (configs/tiny.py, L2/H128/A2) as
the teacher of a one-layer student that starts as its first layer, on the same demo corpus
and tokenizer; minutes on a laptop.

    python train.py --config configs/tiny.py --workdir runs/tiny
    python train.py --config configs/distil_tiny.py --workdir runs/distil_tiny \
        --config.teacher=runs/tiny

Its summary sets the student's masked-LM accuracy beside the unigram baseline; the metrics
show the soft cross-entropy (train/distill_ce) and the hidden states' cosine distance
(train/distill_cos) falling.
"""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.objective = "distill"
    config.teacher = "runs/tiny"
    config.model.num_layers = 1
    config.distill_student_layers = "0"
    config.num_train_steps = 300
    config.optimizer.warmup_steps = 30
    config.eval_every_steps = 100
    config.checkpoint_every_steps = 100
    return config
