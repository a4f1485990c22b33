"""Lossless self-speculative decoding: a run's own MTP modules draft, its trunk verifies.

MTP training leaves modules that predict t+2, t+3, ...; kept at inference they are free drafters.
Each step the drafter proposes k tokens per row and the trunk scores the pending token and all k
drafts in one forward (`accept` is the one place the acceptance rule lives):
- greedy: keep the longest prefix of drafts equal to the trunk's argmax, then the trunk's own next
  token (the correction, or a bonus when all k matched) — output identical to `generate`;
- temperature > 0: speculative sampling (Leviathan et al. 2023, Chen et al. 2023): keep draft i with
  probability min(1, p/q); at the first rejection sample from norm(max(0, p - q)), after k accepted
  drafts from p. The output distribution is the trunk's own.

Bookkeeping per row: the trunk's KV cache holds positions 0..c-1 and `seq[c]` is the pending token
(committed, not yet fed to the trunk); positions after c in `seq` are scratch for drafts. Rejected
drafts are undone by setting the trunk's cache length (`StaticKVCache.rollback`, or `advance` past the
kept tokens in the fused loop; module caches are written at explicit positions and simply overwritten);
rows accept different numbers of drafts (ragged) and leave the batch when they finish.

Drafters:
- `SequentialDrafter` (DeepSeek-V3 modules): depth d at position j fuses h^{d-1}_j with Emb(x_{j+d})
  and predicts x_{j+d+1}, exactly the training alignment of `MTPModel.hidden_states`. Each module
  keeps its own KV cache; every step each depth re-runs the window of positions whose inputs were
  not all committed last step (it used drafts there), so its cache only ever keeps exact states.
  Draft lengths beyond D reuse module D one position further right, its own output standing in
  for the missing deeper state (as vLLM/EAGLE reuse one MTP layer).
- `ParallelDrafter` (Meta heads): heads 2..n read the input of the trunk's last layer, each with its
  own KV cache, and draft t+2..t+n from the same position.
All forwards run on the decode engine (`engine.py`): the trunk's verification at fixed width k+1
(compiled with `compile=True`), the modules eager; one row, greedy, both in one call (`FusedGreedyStep`,
compiled whole). There, with one draft per step, `draft_width` w > 1 verifies the module's top w
candidates for the next token instead of its top one, as a depth-1 token tree (Medusa's and EAGLE's tree
attention, one level deep): at most one candidate can equal the trunk's token, so the step accepts 0 or 1
and the output is still greedy's, while the chance of accepting one grows from top-1 to top-w agreement.

Counters follow vLLM: acceptance rate = accepted / drafted, mean acceptance length (MAL)
= 1 + accepted / steps (a step is one row's draft-and-verify), per-position acceptance counts
position i only when positions 1..i were all accepted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mtp_cli.base.errors import UserError
from mtp_cli.decode.engine import Engine, Stores, engine_for
from mtp_cli.decode.generate import StopFn, cache_capacity, next_token, prefill, probs_from_logits
from mtp_cli.decode.timing import NO_TIMER


@dataclass
class SpecStats:
    k: int  # drafts per step
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    accepted_at: list[int] = field(default_factory=list)  # [i]: steps whose drafts 1..i+1 were all accepted

    def __post_init__(self) -> None:
        self.accepted_at = self.accepted_at or [0] * self.k

    def record(self, n_accepted: Tensor | list[int]) -> None:
        """Count steps, one per row, that accepted these numbers of drafts."""
        for n in n_accepted.tolist() if isinstance(n_accepted, Tensor) else n_accepted:
            self.steps += 1
            self.drafted += self.k
            self.accepted += n
            for i in range(n):
                self.accepted_at[i] += 1

    def merge(self, other: SpecStats) -> None:
        self.drafted, self.accepted, self.steps = (self.drafted + other.drafted, self.accepted + other.accepted,
                                                   self.steps + other.steps)
        self.accepted_at = [a + b for a, b in zip(self.accepted_at, other.accepted_at)]

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.steps if self.steps else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [a / self.steps if self.steps else None for a in self.accepted_at]

    def to_dict(self) -> dict:
        return {"draft_len": self.k, "drafted": self.drafted, "accepted": self.accepted, "steps": self.steps,
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance}


def accept(drafts: Tensor, draft_probs: Tensor | None, logits: Tensor, temperature: float = 0.0,
           top_p: float = 1.0, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """The acceptance rule. drafts (B, k); draft_probs (B, k, V): the distributions they were sampled
    from (unused when greedy); logits (B, k+1, V): the trunk's at the pending token and each draft.
    Returns (accepted (B,) in 0..k, next token (B,)): a row keeps drafts[:accepted], then next token."""
    k, rows = drafts.shape[1], torch.arange(drafts.shape[0], device=drafts.device)
    if temperature <= 0:
        target = logits.argmax(-1)
        n = (drafts == target[:, :k]).cumprod(1).sum(1)
        return n, target[rows, n]
    p = probs_from_logits(logits, temperature, top_p)
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    q_d = draft_probs.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(p_d.shape, generator=generator, device=p_d.device)
    n = (u * q_d < p_d).cumprod(1).sum(1)  # u < p/q: accept with probability min(1, p/q)
    q = torch.cat([draft_probs, torch.zeros_like(p[:, :1])], 1)  # after k accepted drafts: sample from p
    residual = (p[rows, n] - q[rows, n]).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, n])  # p == q up to rounding
    return n, torch.multinomial(residual, 1, generator=generator).squeeze(-1)


def _pick(logits: Tensor, temperature: float, top_p: float, generator, vocab: Tensor | None = None,
          vocab_size: int = 0) -> tuple[Tensor, Tensor | None]:
    """A draft token from (B, V') logits and the distribution it came from (None when greedy), as
    (B, vocab_size) over the full vocabulary. `vocab`: the ids the V' logits score (None: all)."""
    if temperature <= 0:
        pick = logits.argmax(-1)
        return (pick if vocab is None else vocab[pick]), None
    q = probs_from_logits(logits, temperature, top_p)
    pick = torch.multinomial(q, 1, generator=generator).squeeze(-1)
    if vocab is None:
        return pick, q
    return vocab[pick], q.new_zeros(q.shape[0], vocab_size).index_copy_(1, vocab, q)


class Drafter(ABC):
    """Proposes `k` tokens per row each step and is told which trunk positions were committed. Built
    once (`make_drafter` checks k and the width), then `reserve`d for each call's batch and length; its
    `engine` is the one the trunk verifies on."""

    engine: Engine
    k: int
    width: int = 1

    def reserve(self, batch: int, capacity: int) -> Drafter:  # noqa: B027 (optional hook)
        """Fresh state for `batch` rows of up to `capacity` positions; returns the drafter."""
        return self

    def commit(self, start: Tensor, n_new: Tensor, hidden: Tensor, shared: Tensor) -> None:  # noqa: B027 (optional hook)
        """The trunk ran positions start[b].. (hidden (B, W, d) before its final norm, shared (B, W, d)
        the input of its last layer); the first n_new[b] of them are committed."""

    @abstractmethod
    def propose(self, seq: Tensor, lengths: Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> tuple[Tensor, Tensor | None]:
        """Drafts (B, k) for positions lengths+1.. and their distributions (B, k, V), None when greedy."""

    def select(self, rows: Tensor) -> None:  # noqa: B027 (optional hook)
        """Keep only these batch rows."""


class _ModuleDrafter(Drafter):
    """Shared by the MTP drafters: a buffer of trunk states per position, one static KV cache per
    module (written and masked at explicit positions, so nothing needs rolling back: stale slots
    beyond a query's position are masked and later overwritten), and `exact`, the position below
    which every module cache holds exact (committed-input) states."""

    def __init__(self, engine: Engine, k: int, n_modules: int, vocab: Tensor | None = None, width: int = 1):
        if width > 1 and k != 1:
            raise UserError(f"a draft width of {width} (candidates for the next token) needs one draft per step, "
                            f"got --draft-len {k}")
        self.engine, self.k, self.width = engine, k, width
        drafts_from = engine.unembed.shape[1] if vocab is None else len(vocab)
        if width > drafts_from:
            raise UserError(f"a draft width of {width} exceeds the {drafts_from} tokens the modules draft from "
                            "(--draft-vocab)")
        self.first_logits: Tensor | None = None  # the last `propose`'s logits for its first draft (B, V')
        self.vocab = None if vocab is None else vocab.to(engine.device)  # the draft vocabulary (draft_vocab.py)
        self.vocab_size, self.n_modules = engine.unembed.shape[1], n_modules
        # what makes a `FusedGreedyStep` (and its compiled graph) for this engine
        self.fused_key = ("fused-greedy", type(self).__name__, k, width,
                          None if vocab is None else vocab.cpu().numpy().tobytes())

    def reserve(self, batch: int, capacity: int) -> _ModuleDrafter:
        engine = self.engine
        self.capacity, self.first_logits = capacity, None
        self.states = torch.zeros(batch, capacity, engine.cfg.d_model, device=engine.device, dtype=engine.dtype)
        self.caches = [engine.new_cache(batch, capacity, n_layers=1) for _ in range(self.n_modules)]
        self.exact = torch.zeros(batch, dtype=torch.long, device=engine.device)
        self.steps = torch.arange(capacity, device=engine.device)
        return self

    def _pick(self, logits: Tensor, temperature, top_p, generator) -> tuple[Tensor, Tensor | None]:
        """A draft from logits over the draft vocabulary (`_pick`)."""
        if self.first_logits is None:
            self.first_logits = logits
        return _pick(logits, temperature, top_p, generator, self.vocab, self.vocab_size)

    def _store(self, start: Tensor, states: Tensor) -> None:
        if len(start) == 1:  # one row: slices, not index tensors (fewer, cheaper calls per step)
            s = int(start[0])
            n = min(states.shape[1], self.capacity - s)
            self.states[:, s:s + n] = states[:, :n]
            return
        pos = (start[:, None] + self.steps[: states.shape[1]]).clamp_(max=self.capacity - 1)
        self.states[torch.arange(len(start), device=start.device)[:, None], pos] = states

    def _window(self, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's positions exact..c-1, left-aligned and padded to the widest row: (trunk states
        there (B, W, d), index of each row's last real position (B,), the positions (B, W))."""
        if len(lengths) == 1:
            e, c = int(self.exact[0]), int(lengths[0])
            return self.states[:, e:c], self.steps[c - e - 1: c - e], self.steps[None, e:c]
        width = lengths - self.exact
        pos = (self.exact[:, None] + self.steps[: int(width.max())]).clamp_(max=self.capacity - 1)
        rows = torch.arange(len(lengths), device=lengths.device)[:, None]
        return self.states[rows, pos], width - 1, pos

    def select(self, rows: Tensor) -> None:
        self.states, self.exact = self.states[rows], self.exact[rows]
        for cache in self.caches:
            cache.select(rows)


class SequentialDrafter(_ModuleDrafter):
    """DeepSeek-V3 modules: chain depths 1..min(k, D) at the pending token's position, then reuse
    module D one position to the right for drafts beyond D."""

    def __init__(self, engine: Engine, model, k: int, vocab: Tensor | None = None, width: int = 1):
        self.depth = min(k, model.n_extra)
        super().__init__(engine, k, self.depth, vocab, width)
        self.post_norm = model.mtp_cfg.mtp_input == "post-norm"
        self.unembeds = [engine.draft_unembed(m.unembed, self.vocab) for m in engine.sequential[: self.depth]]

    def commit(self, start: Tensor, n_new: Tensor, hidden: Tensor, shared: Tensor) -> None:  # noqa: B027 (optional hook)
        self._store(start, self.engine.depth_one_input(hidden, shared, self.post_norm))

    def propose(self, seq, lengths, temperature, top_p, generator):
        engine, self.first_logits = self.engine, None
        rows = torch.arange(len(lengths), device=lengths.device)
        h, last, positions = self._window(lengths)
        one = len(lengths) == 1  # one row: its window has no padding, so its last position is the last
        drafts, probs = [], []
        for d in range(1, self.depth + 1):
            # x_{j+d} for window position j; after the pending token these are earlier drafts
            if one and int(positions[0, -1]) + d < seq.shape[1]:
                tokens = seq[:, int(positions[0, 0]) + d: int(positions[0, -1]) + d + 1]
            else:
                tokens = seq.gather(1, (positions + d).clamp_(max=seq.shape[1] - 1))
            h, logits = engine.sequential_module(d, h, tokens, positions, self.caches[d - 1],
                                                 self.unembeds[d - 1] if one else None)
            h_last = h[:, -1] if one else h[rows, last]
            logits = logits if one else engine.head(h_last, self.unembeds[d - 1])
            tok, q = self._pick(logits, temperature, top_p, generator)
            seq[rows, lengths + d] = tok
            drafts.append(tok)
            probs.append(q)
        h = h_last[:, None]
        for i in range(self.depth + 1, self.k + 1):
            if self.depth == 1 and self.post_norm:  # module 1 was trained on a post-final-norm state
                h = engine.head_norm(h, engine.sequential[0].out_norm)
            positions = (lengths + (i - self.depth - 1))[:, None]
            h, logits = engine.sequential_module(self.depth, h, drafts[-1][:, None], positions,
                                                 self.caches[self.depth - 1], self.unembeds[self.depth - 1])
            tok, q = self._pick(logits, temperature, top_p, generator)
            drafts.append(tok)
            probs.append(q)
        self.exact = (lengths - self.depth + 1).clamp_(min=0)  # depth d at j read x_{j+d}: committed iff j+d <= c
        return torch.stack(drafts, 1), (torch.stack(probs, 1) if temperature > 0 else None)


class ParallelDrafter(_ModuleDrafter):
    """Meta heads 2..k+1 on the shared state (the input of the trunk's last layer, which the engine's
    trunk forward returns beside its output)."""

    def __init__(self, engine: Engine, model, k: int, vocab: Tensor | None = None, width: int = 1):
        super().__init__(engine, k, k, vocab, width)
        self.unembed = engine.draft_unembed(engine.unembed, self.vocab)

    def commit(self, start: Tensor, n_new: Tensor, hidden: Tensor, shared: Tensor) -> None:  # noqa: B027 (optional hook)
        self._store(start, shared)

    def propose(self, seq, lengths, temperature, top_p, generator):
        rows, self.first_logits = torch.arange(len(lengths), device=lengths.device), None
        shared, last, positions = self._window(lengths)
        drafts, probs = [], []
        for j in range(self.k):
            one = len(lengths) == 1
            h, logits = self.engine.parallel_head(j, shared, positions, self.caches[j], self.unembed if one else None)
            logits = logits if one else self.engine.head(h[rows, last], self.unembed)
            tok, q = self._pick(logits, temperature, top_p, generator)
            drafts.append(tok)
            probs.append(q)
        self.exact = lengths.clone()
        return torch.stack(drafts, 1), (torch.stack(probs, 1) if temperature > 0 else None)


class FusedGreedyStep(torch.nn.Module):
    """One row, greedy: the trunk verifies the pending token and k drafts, `accept` keeps a prefix, and
    the drafter's modules draft the next step from the states just committed, all in one call (one
    graph under --compile): no host round trip between verifying and drafting. This works because the
    modules' window after verification is the verification window itself: at position c+j a module
    reads the trunk's state there and the token after it, which is draft j+1 for j < n accepted and
    the trunk's own token at j = n; the columns past n are scratch that no later query reads (masked,
    then overwritten by the next window). Sequential modules draft one token (module 1, k = 1);
    parallel heads any k. Returns out (1, k+2): the number of drafts accepted, the trunk's next token and
    the next k drafts, read back with one `tolist`; `out[:, 1:]` is the next call's tokens. A drafter of
    width w > 1 (k = 1) verifies a tree of candidates instead (`_tree`)."""

    def __init__(self, drafter: _ModuleDrafter):
        super().__init__()
        self.engine, self.k, self.width = drafter.engine, drafter.k, drafter.width
        self.sequential = isinstance(drafter, SequentialDrafter)
        self.post_norm = self.sequential and drafter.post_norm
        # a draft vocabulary's columns of the unembedding are this module's; the full one is the engine's
        draft_unembed = None if drafter.vocab is None else drafter.unembeds[0] if self.sequential else drafter.unembed
        self.register_buffer("draft_unembed", draft_unembed, persistent=False)
        self.register_buffer("vocab", drafter.vocab, persistent=False)
        self.register_buffer("tree_depth", torch.tensor([0] + [1] * self.width, device=self.engine.device),
                             persistent=False)

    def _unembed(self) -> Tensor:
        """The unembedding the next draft is read through: the draft vocabulary's columns, else the full one
        of module 1 (sequential) or the trunk (parallel heads), which stays the engine's (not this module's)."""
        if self.draft_unembed is not None:
            return self.draft_unembed
        return self.engine.sequential[0].unembed if self.sequential else self.engine.unembed

    @staticmethod
    def supports(drafter: Drafter) -> bool:
        return isinstance(drafter, ParallelDrafter) or (isinstance(drafter, SequentialDrafter) and drafter.k == 1)

    def forward(self, tokens: Tensor, k_stores: list[Tensor], v_stores: list[Tensor], module_k: list[Tensor],
                module_v: list[Tensor], start: int) -> Tensor:
        engine, k = self.engine, self.k
        if self.width > 1:
            return self._tree(tokens, k_stores, v_stores, module_k, module_v, start)
        logits, hidden, shared = engine.row_step(tokens, k_stores, v_stores, start)
        drafts = tokens[:, 1:]
        n, nxt = accept(drafts, None, logits)
        # the token after each position: the drafts, then the trunk's own token at n
        after = torch.where(engine.key_index[: k + 1] == n, nxt[:, None], tokens.roll(-1, 1))
        plan = engine.row_plan(start, k + 1)
        unembed = self._unembed()
        picks = []
        if self.sequential:
            h = engine.depth_one_input(hidden, shared, self.post_norm)
            outs = [engine.module_window(0, h, after, plan, module_k[0], module_v[0])]
        else:
            outs = [engine.module_window(j, shared, None, plan, module_k[j], module_v[j]) for j in range(k)]
        for out in outs:
            pick = engine.head(out.index_select(1, n)[:, 0], unembed).argmax(-1)  # (1,): the column at n
            picks.append(pick if self.vocab is None else self.vocab[pick])
        return torch.cat([n[:, None], nxt[:, None], *(p[:, None] for p in picks)], 1)

    def _tree(self, tokens: Tensor, k_stores: list[Tensor], v_stores: list[Tensor], module_k: list[Tensor],
              module_v: list[Tensor], start: int) -> Tensor:
        """Width w > 1: tokens (1, 1+w) are the pending token and w candidates for the position after it
        (the module's top w), verified in one forward as a depth-1 token tree (`Engine.tree_plan`). At most one
        candidate equals the trunk's token; its keys and values move to the slot after the pending token's, so
        the cache holds exactly the committed sequence. The module then drafts from the pending token's state
        and the accepted candidate's. Returns out (1, w+3): the number accepted (0 or 1), the trunk's token at
        the pending position, its token after the accepted one (= the former when none was), and the next w
        candidates; `out[:, 2:]` is the next call's tokens."""
        engine, w = self.engine, self.width
        hidden, shared = engine.run_trunk(tokens, engine.tree_plan(start, w, self.tree_depth), Stores(k_stores, v_stores))
        logits = engine.head(hidden)
        target = logits[:, 0].argmax(-1)  # (1,)
        match = tokens[:, 1:] == target[:, None]
        n = match.any(1).long()
        col = match.int().argmax(1) + 1  # the accepted candidate's column; 1 (a self-copy below) when none was
        nxt = torch.where(n.bool(), logits.index_select(1, col)[:, 0].argmax(-1), target)
        for store in (*k_stores, *v_stores):
            store[:, :, start + 1:start + 2] = store.index_select(2, col + start)
        states = engine.depth_one_input(hidden, shared, self.post_norm) if self.sequential else shared
        pair = torch.cat([states[:, :1], states.index_select(1, col)], 1)  # the committed positions' states
        after = torch.cat([target, nxt])[None] if self.sequential else None  # the token after each
        out = engine.module_window(0, pair, after, engine.row_plan(start, 2), module_k[0], module_v[0])
        unembed = self._unembed()
        picks = engine.head(out.index_select(1, n)[:, 0], unembed).topk(w, -1).indices
        picks = picks if self.vocab is None else self.vocab[picks]
        return torch.cat([n[:, None], target[:, None], nxt[:, None], picks], 1)


def draft_len_for(model, draft_len: int | None = None) -> int:
    """The number of drafts per step: by default one per module/head; checked against the model."""
    n = model.n_extra
    if n == 0:
        raise UserError(f"this run's objective is {model.objective!r}: it has no MTP modules to draft with")
    k = n if draft_len is None else draft_len
    if k < 1:
        raise UserError(f"--draft-len must be >= 1, got {k}")
    if model.objective == "parallel" and k > n:
        raise UserError(f"parallel heads draft at most {n} tokens (heads 2..{n + 1}), got --draft-len {k}")
    return k


def make_drafter(model, draft_len: int | None = None, *, compile: bool | None = None,
                 draft_vocab: Tensor | None = None, width: int = 1) -> Drafter:
    """The model's own drafter, the one place its draft length (`draft_len_for`) and width are checked.
    `compile`: the engine's switch (None: the device's default); `draft_vocab`: the token ids the modules
    draft from (`draft_vocab.top_tokens`; None: all); `width` > 1 (one row, greedy, k = 1, the fused loop
    only): the top `width` candidates for the next token, verified as a tree (`FusedGreedyStep._tree`)."""
    k = draft_len_for(model, draft_len)
    if width < 1:
        raise UserError(f"--draft-width must be >= 1, got {width}")
    cls = ParallelDrafter if model.objective == "parallel" else SequentialDrafter
    return cls(engine_for(model.trunk, model, compile), model, k, draft_vocab, width)


@torch.no_grad()
def speculative_generate(drafter: Drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                         temperature: float = 0.0, top_p: float = 1.0, stop: StopFn | None = None,
                         eos_id: int | None = None, generator: torch.Generator | None = None,
                         stats: SpecStats | None = None, timer=None, fused: bool = True) -> list[list[int]]:
    """`generate`'s contract for the trunk the drafter's engine runs (greedy: its exact output), drafting
    with `drafter` (`make_drafter`: the model's own modules). `stats` accumulates counters, `timer` times
    the phases prefill / draft0 (the modules' pass over the prompt) / draft / verify. One row, greedy, with
    the model's own modules: verification and the next draft run as one call (`FusedGreedyStep`) unless
    `fused=False`; only there does a drafter of width > 1 verify its top candidates for the next token as
    a tree (sampling, batches and CUDA's fixed-shape graphs draft a chain of width 1)."""
    if not prompts:
        return []
    engine, timer, k = drafter.engine, timer or NO_TIMER, drafter.k
    stats = stats if stats is not None else SpecStats(k)
    fusable = fused and temperature <= 0 and len(prompts) == 1 and not engine.static
    room = max(k, drafter.width)  # scratch past the committed tokens: drafts, or tree candidates
    cache_len = cache_capacity(engine, max(len(p) for p in prompts) + max_new_tokens + room + 2)
    drafter.reserve(len(prompts), cache_len + 2 * k + 2)
    with timer("prefill"):
        cache, logits, hidden, shared = prefill(engine, prompts, cache_len, pad_id=eos_id or 0)
        tokens = next_token(logits, temperature, top_p, generator)
    device, lengths = logits.device, cache.lengths.clone()
    seq = torch.zeros(len(prompts), cache_len + k + 2, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        seq[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    rows = torch.arange(len(prompts), device=device)
    seq[rows, lengths] = tokens
    drafter.commit(torch.zeros_like(lengths), lengths, hidden, shared)
    outputs: list[list[int]] = [[] for _ in prompts]
    if fusable and FusedGreedyStep.supports(drafter):
        return _fused_greedy(drafter, cache, seq, outputs, max_new_tokens, eos_id, stop, stats, timer)
    active = list(range(len(prompts)))
    n_new, new = torch.ones_like(lengths), tokens[:, None]
    span = torch.arange(k + 1, device=device)
    frozen = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    phase = "draft0"
    while True:
        keep = _emit(outputs, active, new.tolist(), n_new.tolist(), max_new_tokens, eos_id, stop)
        if not keep:
            return outputs
        if engine.static and len(keep) < len(active) - int(frozen.sum()):
            # fixed-shape graphs: finished rows ride along (one batch shape, no recompilation), frozen in place
            for row in set(range(len(active))) - set(keep):
                active[row] = None
            frozen = torch.tensor([i is None for i in active], device=device)
        elif not engine.static and len(keep) < len(active):
            rows = torch.tensor(keep, device=device)
            frozen = frozen[rows]
            cache.select(rows)
            drafter.select(rows)
            seq, lengths = seq[rows], lengths[rows]
            active = [active[r] for r in keep]
            rows = torch.arange(len(keep), device=device)
        with timer(phase):
            drafts, q = drafter.propose(seq, lengths, temperature, top_p, generator)
        phase = "draft"
        with timer("verify"):
            logits, hidden, shared = engine.step(torch.cat([seq[rows, lengths][:, None], drafts], 1), cache)
            n_acc, nxt = accept(drafts, q, logits, temperature, top_p, generator)
        stats.record(n_acc[~frozen])
        new = torch.cat([drafts, nxt[:, None]], 1)
        new[rows, n_acc] = nxt  # committed: drafts[:n_acc], then the trunk's token
        n_new = (n_acc + 1).masked_fill_(frozen, 0)
        seq[rows[:, None], lengths[:, None] + 1 + span] = new
        drafter.commit(lengths, n_new, hidden, shared)
        lengths = lengths + n_new
        cache.rollback(lengths)


def fused_input(tokens: Tensor, lead: int = 1) -> Tensor:
    """tokens (1, T), the pending token and its drafts, laid out as every later fused call gets them:
    `out[:, lead:]` of `FusedGreedyStep`'s output (lead 2 for a tree, `fused_lead`). A compiled graph is
    specialised to its input's strides, so a first call with a contiguous (1, T) tensor would build a
    second graph."""
    return torch.cat([tokens.new_zeros(1, lead), tokens], 1)[:, lead:]


def fused_lead(drafter: _ModuleDrafter) -> int:
    """Where the next call's tokens start in a `FusedGreedyStep` output: after the count (and, for a
    tree, the trunk's token at the pending position)."""
    return 2 if drafter.width > 1 else 1


def first_fused_tokens(drafter: _ModuleDrafter, pending: Tensor, drafts: Tensor) -> Tensor:
    """The first fused call's tokens (`fused_input`): the pending token (1, 1) and `propose`'s drafts, or
    for a tree the top `width` candidates of the logits that drafted them."""
    if drafter.width > 1:
        drafts = drafter.first_logits.topk(drafter.width, -1).indices
        drafts = drafts if drafter.vocab is None else drafter.vocab[drafts]
    return fused_input(torch.cat([pending, drafts], 1), fused_lead(drafter))


def fused_verify_and_draft(drafter: _ModuleDrafter, tokens: Tensor, cache) -> Tensor:
    """One `FusedGreedyStep` call on the drafter's engine over tokens (1, k+1) = the pending token and the
    drafts, or (1, w+1) = the pending token and a tree's w candidates (`fused_input`, or the previous call's
    `out[:, fused_lead(drafter):]`); the step (and its compiled graph) is built once per engine for the
    drafter's kind, draft length, width and draft vocabulary. Returns its out, (1, k+2) or (1, w+3)."""
    return drafter.engine.fused_step(drafter.fused_key, lambda: FusedGreedyStep(drafter), tokens, cache,
                                     drafter.caches)


def _fused_greedy(drafter: _ModuleDrafter, cache, seq: Tensor, outputs: list[list[int]], max_new_tokens: int,
                  eos_id: int | None, stop: StopFn | None, stats: SpecStats, timer) -> list[list[int]]:
    """`speculative_generate`'s loop for one row, greedy: each step one `FusedGreedyStep` call verifies
    and drafts (timed as the phase verify_draft)."""
    with timer("draft0"):
        first, _ = drafter.propose(seq, cache.lengths, 0.0, 1.0, None)
        c = int(cache.lengths[0])
        tokens = first_fused_tokens(drafter, seq[:, c:c + 1], first)
    lead = fused_lead(drafter)
    token, *drafts = tokens[0].tolist()  # Python ints from here on
    new = [token]
    while _emit(outputs, [0], [new], [len(new)], max_new_tokens, eos_id, stop):
        with timer("verify_draft"):
            out = fused_verify_and_draft(drafter, tokens, cache)
            row = out[0].tolist()  # the step's one read back
            tokens = out[:, lead:]
        n, token = row[0], row[lead]
        stats.record([n])
        new = (row[1:2] if lead == 2 else drafts)[:n] + [token]  # a tree's accepted token is the trunk's own
        cache.advance(n + 1)
        drafts = row[lead + 1:]
    return outputs


def _emit(outputs: list[list[int]], active: list[int | None], new: list[list[int]], n_new: list[int],
          max_new_tokens: int, eos_id: int | None, stop: StopFn | None) -> list[int]:
    """Append each row's committed tokens one at a time, with `generate`'s stopping rules (EOS, the
    stop function, the length limit); returns the batch rows that go on."""
    keep = []
    for row, i in enumerate(active):
        if i is None:  # a finished row riding along
            continue
        out = outputs[i]
        for tok in new[row][: n_new[row]]:
            out.append(tok)
            if (eos_id is not None and tok == eos_id) or (stop is not None and stop(i, out)) \
                    or len(out) >= max_new_tokens:
                break
        else:
            keep.append(row)
    return keep
