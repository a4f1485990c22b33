"""A run's training text when it is not just files: `token_data` gives a run its tokens (the recipe's corpus,
or a self-distilled one), `selfdistill` makes the trunk's own continuations. Above `model`, since making
that text runs the source checkpoint."""
