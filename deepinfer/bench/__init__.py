"""`deepinfer bench`: the workloads of BENCHMARKS.md, with an optional transformers peer in the same run."""
