"""A task's fine-tuning steps built as the engine builds them, data-parallel over every device
without accumulation, for the tests that step a head by hand."""

from bertjax.engine import optim
from bertjax.finetune.objective import build_finetuning

# One step at learning rate 1e-3 from the first: no warmup to wait through.
ONE_STEP = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=1)


def data_parallel_finetuning(config, head, optimizer=ONE_STEP, *, batch: int = 8, seq: int = 8):
    """build_finetuning's steps for `head` on `config`, with `optimizer`, on a mesh of every
    device along the data axis, one micro-batch of `batch` rows of `seq` tokens a step."""
    return build_finetuning(
        config,
        head,
        optimizer,
        mesh_shape=(-1, 1, 1),
        grad_accum_steps=1,
        micro_batch_size=batch,
        max_seq_length=seq,
    )
