"""Which rungs of the ladder an LLM writes, by number.

A leaf: the config (which checks a caller's `prompts` against it) and the strategy registry
(which builds the ladder on it) both import it, so that the config need not import the
registry, which imports the planners, which import the config.
"""

from __future__ import annotations

from typing import Final

#: The rungs whose replacements an LLM writes: S1 (tool runs), S4 (rounds), S5 (large
#: messages), S6 (the current round) and S7 (the fold). Their prompts are replaceable; the
#: others (S2, S3 previews, S8 masking) need no LLM.
LLM_STRATEGIES: Final[tuple[int, ...]] = (1, 4, 5, 6, 7)
