"""Drafters: the contract every one keeps (``base``), the method registry (``registry``: name,
options, builder), one folder per trained method (``draft_model/``, ``eagle/``, ``medusa/``)
and the small ones as modules (``ngram``, ``lookahead``).

This package's ``__init__`` imports nothing, so that importing the contract does not load every
drafter: import from the modules (``quickdraft.drafters.registry.build_drafter``).
"""
