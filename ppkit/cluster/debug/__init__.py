"""pdb on ranks, the kernel's side: prompts asked through the kernel's stdin (sessions.py), post-mortems
(``cluster.debug()`` and ``%debug``, post_mortem.py), and the failed rank of a ppkit.spawn / %%torchrun call
kept for one (parked.py). The ranks' side is ppkit/transport/debug/."""
