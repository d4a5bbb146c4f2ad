"""Structured outputs: JSON Schema, any JSON object, regular expressions, choices and Lark or
GBNF grammars, through llguidance.

``Constraint`` (``spec.py``) is what a request asks for, compiled to the library's grammar
once; ``Grammars`` (``matcher.py``) binds constraints to a model's tokenizer and gives each
request a ``Matcher``: the allowed next tokens, the masks along a draft path (rolled back
after), and the tokens the grammar forces. The semantics the engine gives them
(``engine.constrain``), as vLLM does: the target's logits are masked to the allowed tokens
before temperature, top-k and top-p, at every position of a verify pass, so speculation
samples exactly the constrained distribution; tokens the grammar forces are drafted as point
masses without the drafter.
"""

from quickdraft.constraints.matcher import Grammars, Matcher
from quickdraft.constraints.spec import KINDS, Constraint

__all__ = ["KINDS", "Constraint", "Grammars", "Matcher"]
