"""What pretraining and fine-tuning share, knowing no task.

settings.py           settings both runs share, and the one way a config is read
steps.py              the train state, its sharded creation, the jitted train and eval
                      steps (micro-batches, packing)
loop.py               the loop body: restore, iterate, log, evaluate, save, stop
optim.py              optimizers, learning-rate schedules, the weight-decay mask
checkpoint.py         Orbax checkpoints: async saves, resume with fallback, params only
integrity.py          every array leaf's fingerprint, recorded at save, checked at restore
orbax_logs.py         Orbax's repeated failure logs kept at DEBUG
compilation_cache.py  jax's persistent compilation cache, on for the commands
compile_ahead.py      programs compiled ahead in background threads
perf.py               throughput: model FLOPs, accelerator peaks, rows per CPU call
host_memory.py        XLA's CPU runtime keeps a step's memory for the next
rundir.py             the run directory (its layout named once), opening any run, the lock
metrics_writer.py     metrics.jsonl, TensorBoard event files, the progress bar
"""
