"""pdb on ranks, the rank's side: a pdb whose terminal is the control channel (rank_pdb.py) and the
messages it sends and reads (messages.py). The kernel's side is ppkit/cluster/debug/."""
