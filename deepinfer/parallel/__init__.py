"""Several processes running one model: tensor parallelism on torch.distributed.

Rank 0 (the driver) holds the engine: scheduler, request table, sampler. Ranks 1..N-1 run
``worker.serve_driver``: each step they receive its inputs from rank 0 (``protocol``) and run their
shard of the model; only rank 0 gets logits and samples. ``launch`` starts the ranks (spawned on
one host, or joined through env:// when a launcher such as torchrun started them); ``checks``
refuses bad combinations before any process starts."""
