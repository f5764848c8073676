"""DistilBERT: BERT-base distilled into six layers (Sanh et al. 2019).

The student is BERT-base with every other of the teacher's twelve layers (0, 2, ..., 10), its
embeddings and masked-LM head, trained on the masked LM alone (no next-sentence task) with
DistilBERT's loss: 5 x the soft cross-entropy against the teacher's masked-LM distribution at
temperature 2, 2 x the masked LM, 1 x the cosine between the last hidden states. The teacher
is a BERT-base run (configs/base.py) or transformers directory; its tokenizer is the run's.
DistilBERT trained with large batches (4k sequences, gradient accumulation) and dynamic
masking for about 90 hours on 8 V100s; these are its optimizer's settings (Adam at 5e-4,
warmup 5% of the steps, linear decay).

    python train.py --config configs/distil_base.py --workdir runs/distil_base \
        --config.teacher=runs/base --config.data.input='/data/wiki/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "distill"
    config.model.num_layers = 6
    config.distill_student_layers = "0,2,4,6,8,10"
    config.distill_temperature = 2.0
    config.distill_weights = "5,2,1"
    config.data.layout = "packed"  # whole documents: no sentence pairs without the NSP task
    config.data.dupe_factor = 1
    config.optimizer.learning_rate = 5e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 5_000
    config.num_train_steps = 100_000
    config.batch_size = 4096
    config.grad_accum_steps = 16
    return config
