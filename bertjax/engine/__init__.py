"""What pretraining and fine-tuning share, knowing no task: typed settings, the
train state and jitted steps, the loop body, optimizers, checkpoints, the compilation
cache and compile-ahead, throughput, host memory, the run directory, metric files."""
