"""Models: the protocol (base.py) and its implementations."""

from quickdraft.models.base import Cache, Model, ModelOutput, Tokenizer
from quickdraft.models.toy import NGramLM, TokenCache, ToyTokenizer

__all__ = ["Cache", "Model", "ModelOutput", "NGramLM", "TokenCache", "Tokenizer", "ToyTokenizer"]
