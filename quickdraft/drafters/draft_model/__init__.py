"""A smaller model of the target's tokenizer drafts k tokens a step."""
