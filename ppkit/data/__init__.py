"""Public-domain text that ships inside the package (README.md here says where it came from), and the byte-level
tokenizer the capstone's model reads it with: a token is a byte, so the vocabulary is 256 and nothing is trained.

    text      the text of a shipped file (default: Genesis and Exodus, King James Version)
    encode    bytes of a string as token ids (int64)
    decode    token ids back to a string
"""

from __future__ import annotations

from importlib import resources

import torch

from ppkit.errors import ConfigError

TEXT = "kjv_genesis_exodus.txt"
VOCAB = 256  # one token per byte value


def text(name: str = TEXT) -> str:
    """The shipped file ``name`` as a string."""
    path = resources.files(__package__).joinpath(name)
    if not path.is_file():
        shipped = sorted(p.name for p in resources.files(__package__).iterdir() if p.name.endswith(".txt"))
        raise ConfigError(f"no text {name!r} ships with ppkit (ppkit/data/ has {shipped}); pass one of those, or "
                          "train on your own string with ppkit.data.encode(your_text).")
    return path.read_text(encoding="utf-8")


def encode(s: str) -> torch.Tensor:
    """UTF-8 bytes of ``s`` as a 1-D int64 tensor of token ids in 0..255."""
    return torch.frombuffer(bytearray(s.encode("utf-8")), dtype=torch.uint8).long()


def decode(ids) -> str:
    """Token ids back to text (bytes that do not form UTF-8 are shown as U+FFFD)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
