"""Structured outputs: constraints compiled to grammars (xgrammar) that mask each step's logits.

`compiler.Grammars` compiles a request's constraint before it is queued (a bad one is an
InvalidRequestError); `masks.GrammarMasks` holds each running request's matcher in the model
runner, fills the token masks of a step while its forward pass runs, and advances the matchers
with the sampled tokens.
"""

from inflight.structured.compiler import CompileStats, Grammars
from inflight.structured.masks import GrammarMasks

__all__ = ["CompileStats", "GrammarMasks", "Grammars"]
