"""A smaller model of the target's tokenizer drafts k tokens a step: drafter.py (the drafter
and its builder), options.py (``DraftModelOptions``)."""
