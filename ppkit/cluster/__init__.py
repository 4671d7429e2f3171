"""Middle layer: start, run on, restart and stop a world of worker processes."""
