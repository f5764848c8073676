"""What every benchmark shares.

- timing: the one timer (warm-up calls, outputs waited for, rounds, median and spread);
- report: the host a figure was measured on, and the JSON row each benchmark ends with;
- fixtures: random parameters, synthetic batches and lengths, vocabularies, BERT directories
  and the data sets that ship inside PyPI wheels;
- hlo: a compiled step's HLO text parsed into instructions sorted by kind of work, and what
  the program holds;
- profile: where a step's time goes, from a jax.profiler trace read against that HLO;
- reference: the reference library's side (transformers models and directories, torch's
  AdamW, the one torch training loop); it imports torch, so only benchmarks that compare
  against transformers import it.
"""
