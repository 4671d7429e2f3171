"""The RPC world whose rank 0 is the notebook kernel (``ppkit.start_rpc``): its options, and the pickler
that sends what a notebook cell defines by value."""
