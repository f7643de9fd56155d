"""The minimal core: interfaces, config, block pool, requests, runner, sampler, engine loop."""
