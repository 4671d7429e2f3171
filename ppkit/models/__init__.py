"""Models split into shards for model and pipeline parallelism."""
