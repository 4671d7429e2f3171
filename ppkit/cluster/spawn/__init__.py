"""``ppkit.spawn``: ``torch.multiprocessing.spawn`` that runs functions defined in notebook cells, and
what it says when a call fails."""
