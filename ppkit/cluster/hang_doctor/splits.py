"""An all_to_all_single's split sizes, held across the ranks: what each rank sends another against what that
rank expects from it. torch's record keeps each rank's whole tensors only, and gloo checks only a rank's piece
for itself; flight_calls keeps each call's elements to and from each rank (``splits``)."""

from __future__ import annotations


def split_words(calls: dict[int, dict]) -> list[str]:
    """For ``calls`` (rank -> its call at one sequence number), each sender and receiver whose split sizes
    disagree, in words; [] where they agree or a call's splits are not known."""
    sends = {rank: {peer: sent for peer, sent, _ in call["splits"]} for rank, call in calls.items()
             if call.get("splits")}
    expects = {rank: {peer: received for peer, _, received in call["splits"]} for rank, call in calls.items()
               if call.get("splits")}
    words = []
    for sender in sorted(sends):
        for receiver, sent in sorted(sends[sender].items()):
            expected = expects.get(receiver, {}).get(sender)
            if expected is not None and expected != sent:
                to = "itself" if receiver == sender else f"rank {receiver}"
                words.append(f"rank {sender} sends {to} {sent} elements (its input_split_sizes), rank {receiver} "
                             f"expects {expected} from {'itself' if receiver == sender else f'rank {sender}'} "
                             "(its output_split_sizes)")
    return words
