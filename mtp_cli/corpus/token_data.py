"""A run's token data: the recipe's corpus, with the trunk's own continuations (`data.source` "self",
alone or mixed into other corpora at `data.self_share`) generated first or read from their cache. Above
the model layer, because making a self-distilled corpus runs the source checkpoint; `data.shards` below
it only tokenizes documents."""

from __future__ import annotations

import dataclasses

from mtp_cli.base import ui
from mtp_cli.corpus import selfdistill
from mtp_cli.data import shards, sources


def _bytes(docs: list[str]) -> int:
    return sum(len(d.encode("utf-8", errors="replace")) for d in docs)


def self_repeats(natural: list[str], generated: list[str], share: float) -> int:
    """How many times each continuation enters the text so that they make about `share` of its bytes
    (at least once; `share` 0: once)."""
    if not share or not natural:
        return 1
    return max(1, round(share / (1 - share) * _bytes(natural) / max(_bytes(generated), 1)))


def mixed_documents(recipe, show_progress: bool = False) -> list[str] | None:
    """The documents of a run whose text includes the trunk's continuations (the other corpora's first,
    then the continuations, repeated to reach data.self_share); None when it has none (`shards.prepare`
    reads the corpora itself)."""
    data = recipe.data
    if not data.uses_self:
        return None
    generated = selfdistill.documents(data, recipe.train.init_from, shards.cache_root(data), show_progress)
    if not data.natural_parts:
        return generated
    natural = sources.corpus(dataclasses.replace(data, source="+".join(data.natural_parts)))
    repeats = self_repeats(natural, generated, data.self_share)
    gen_bytes = repeats * _bytes(generated)
    ui.console.print(f"data: {len(generated):,} continuations × {repeats} = {gen_bytes / (_bytes(natural) + gen_bytes):.1%} "
                     f"of the text's bytes (data.self_share {data.self_share})", markup=False)
    return natural + generated * repeats


def prepare_for(recipe, show_progress: bool = False) -> shards.TokenData:
    """A run's data (`recipe` is a config.Recipe): `prepare`, on `mixed_documents` where the text includes
    the trunk's continuations."""
    return shards.prepare(recipe.data, recipe.model.vocab_size, mixed_documents(recipe, show_progress))
