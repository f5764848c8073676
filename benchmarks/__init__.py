"""bertjax's benchmarks, each beside the reference library it is measured against.

Run one from the repository root as `python -m benchmarks.<name>` (docs/benchmarks.md lists
them with their commands and current figures). Every benchmark times with
`benchmarks.harness.timing`, draws its inputs from `benchmarks.harness.fixtures`, trains its
torch side with `benchmarks.harness.reference` and ends with one JSON row
(`benchmarks.harness.report`).
"""
