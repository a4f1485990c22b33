"""A run's token data: the recipe's corpus, or for `data.source = "self"` the trunk's own
continuations, generated first (or read from their cache). Above the model layer, because making a
self-distilled corpus runs the source checkpoint; `data.shards` below it only tokenizes documents."""

from __future__ import annotations

from mtp_cli.corpus import selfdistill
from mtp_cli.data import shards


def prepare_for(recipe, show_progress: bool = False) -> shards.TokenData:
    """A run's data (`recipe` is a config.Recipe): `prepare`, with the self-distilled corpus of
    train.init_from built (or read from its cache) first when data.source = "self"."""
    docs = None
    if recipe.data.source == "self":
        docs = selfdistill.documents(recipe.data, recipe.train.init_from, shards.cache_root(recipe.data), show_progress)
    return shards.prepare(recipe.data, recipe.model.vocab_size, docs)
