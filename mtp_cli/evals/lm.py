"""An lm-eval model class backed by our trunk and batched KV-cache decoder (`--model mtp`).

lm-eval's `HFLM` on the export gives the same answers (a test checks it on a small `--limit`);
this class is what `mtp eval` uses because it batches generation with ragged prompts, a KV
cache and finished rows leaving the batch. It follows HFLM's conventions: prompts encoded with the
tokenizer's own special-token rule, EOS added to the stop strings, output cut at the first stop
string, loglikelihoods through lm-eval's `TemplateLM` (context/continuation split, rolling
windows). Nothing runs past `max_length` (default: the trained context), by HFLM's rule
(`context`): a generation keeps the rightmost max_length - max_gen_toks prompt tokens, a scored
continuation the rightmost max_length + 1 tokens; with `truncate=False` a prompt that needs a cut
is refused instead. A continuation longer than the context itself is scored in further windows of
max_length tokens (as lm-eval's rolling loglikelihood). Each request's prompt length and cut is
kept in `records`, keyed by (task, kind, doc_id), for the per-item files.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

from mtp_cli.decode import context as ctxlib
from mtp_cli.decode.batching import BATCH_SIZE, encode, generate_ids
from mtp_cli.model.hf import load_export

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default, as HFLM
SCORE_TOKENS_PER_BATCH = 8192  # teacher-forced scoring: rows x width per forward pass


@register_model("mtp")
class MTPLM(TemplateLM):
    def __init__(self, pretrained: str | None = None, trunk=None, tokenizer=None, batch_size: int = BATCH_SIZE,
                 max_length: int | None = None, seed: int = 0, progress=None, truncate: bool = True,
                 compile: bool | None = None, **_ignored):
        super().__init__()
        if pretrained is not None:
            trunk, tokenizer = load_export(pretrained)
        if trunk is None or tokenizer is None:
            raise ValueError("MTPLM needs pretrained=EXPORT_DIR, or trunk= and tokenizer=")
        self.trunk, self.tokenizer = trunk.eval(), tokenizer
        self.batch_size = int(batch_size)
        self._max_length = int(max_length) if max_length else None
        self.generator = torch.Generator(trunk.embed_tokens.weight.device).manual_seed(int(seed))
        self.progress = progress
        self.score_description = "loglikelihood"  # the Rich bar's label while scoring continuations
        self.truncate = truncate
        self.compile = compile  # the decoder's torch.compile switch (None: the device's default)
        self.prompt_lengths: list[int] = []  # token lengths of every generation prompt seen (before any cut)
        self.prompt_cuts: list[int] = []  # tokens cut from the left of each of those prompts
        self.gen_budgets: list[int] = []  # new-token budget of each generation request (after `generation_budget`)
        self.records: dict[tuple[str, int], dict] = {}  # (task, doc_id) -> prompt_tokens, prompt_cut_tokens

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids), split as lm-eval's TemplateLM splits them for scoring."""
        return self._encode_pair(context, continuation)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or self.trunk.cfg.context

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        if add_special_tokens is None:
            return encode(self.tokenizer, string)
        return self.tokenizer(string, add_special_tokens=add_special_tokens).input_ids

    # ---- generation ----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        eos = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        out: list[str | None] = [None] * len(requests)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], DEFAULT_MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = kwargs.pop("max_gen_toks")
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
            top_p = float(kwargs.get("top_p", 1.0) or 1.0)
            max_gen = ctxlib.generation_budget(max_gen, self.max_length)
            prompts = [self.tok_encode(requests[i].args[0]) for i in indices]
            lengths = [len(p) for p in prompts]
            cuts = [ctxlib.generation_cut(n, max_gen, self.max_length) for n in lengths]
            if not self.truncate:
                ctxlib.refuse(requests[indices[0]].task_name or "generate", cuts, lengths, self.max_length,
                              f"+ {max_gen} new tokens")
            prompts = [p[c:] for p, c in zip(prompts, cuts)]
            self.prompt_lengths += lengths
            self.prompt_cuts += cuts
            self.gen_budgets += [max_gen] * len(indices)
            for i, n, c in zip(indices, lengths, cuts):
                self._record(requests[i], "generate", n, c)
            ids = generate_ids(self.trunk, self.tokenizer, prompts, max_gen, temperature=temperature, top_p=top_p,
                               stops=until, generator=self.generator, batch_size=self.batch_size, compile=self.compile,
                               progress=None if disable_tqdm else self.progress, description="gsm8k: generate")
            for i, completion in zip(indices, ids):
                text = self.tokenizer.decode(completion, skip_special_tokens=True)
                out[i] = postprocess_generated_text(text, until, None)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out  # type: ignore[return-value]

    def _record(self, request, kind: str, prompt_tokens: int, cut: int, **more) -> None:
        if getattr(request, "doc_id", None) is not None:
            self.records[(request.task_name, kind, int(request.doc_id))] = {"prompt_tokens": prompt_tokens,
                                                                          "prompt_cut_tokens": cut, **more}

    # ---- likelihoods (TemplateLM turns these into loglikelihood and loglikelihood_rolling) ------
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        """TemplateLM's (tokenize, then `_loglikelihood_tokens`), with our Rich bar instead of lm-eval's tqdm
        and each document's prompt length and cut recorded."""
        self._pending, self._show_bar = requests, not disable_tqdm
        try:
            return super().loglikelihood(requests, disable_tqdm=True)
        finally:
            self._pending, self._show_bar = None, False

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None) -> list[tuple[float, bool]]:
        pairs = [(list(context), list(continuation)) for _key, context, continuation in requests]
        cuts = [ctxlib.scoring_cut(len(c), len(t), self.max_length) for c, t in pairs]
        if not self.truncate:
            ctxlib.refuse("loglikelihood", cuts, [len(c) for c, _ in pairs], self.max_length, "+ continuation")
        pending = getattr(self, "_pending", None)
        on_done = None
        if self.progress is not None and getattr(self, "_show_bar", False):
            task = self.progress.add_task(self.score_description, total=len(pairs), info="")
            on_done = lambda n: self.progress.advance(task, n)  # noqa: E731
        scored = score_continuations(self.trunk, pairs, self.max_length, self.eot_token_id, on_done)
        if pending is not None and len(pending) == len(requests):
            for req, (c, t), cut in zip(pending, pairs, cuts):
                self._record(req, "loglikelihood", len(c), cut, gold_tokens=len(t))
        for (key, _c, _t), result in zip(requests, scored):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return scored

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval import utils  # lm-eval: seconds of start-up, only on this path

        out = []
        for req in requests:
            windows = [(None,) + utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
                token_list=self.tok_encode(req.args[0]), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            out.append(sum(ll for ll, _ in self._loglikelihood_tokens(windows, disable_tqdm=True)))
        return out


@torch.no_grad()
def score_continuations(trunk, pairs, context: int, pad_id: int, on_done=None) -> list[tuple[float, bool]]:
    """(sum of log p, all greedy) of each continuation given its prompt, never past `context` positions.

    The first window holds the rightmost context + 1 tokens of prompt + continuation (`context.scoring_cut`);
    a continuation longer than the context goes on in further windows, each input at most `context` tokens.
    `on_done(n)` is called as pairs finish."""
    windows = []  # (pair index, input ids, offset of the first target in the input, target ids)
    for i, (prompt, continuation) in enumerate(pairs):
        if not prompt:
            raise ValueError("a scored continuation needs at least one prompt token")
        tokens, start = prompt + continuation, len(prompt)
        while start < len(tokens):
            end = min(len(tokens), start + context)
            first = max(0, end - 1 - context)
            windows.append((i, tokens[first:end - 1], start - 1 - first, tokens[start:end]))
            start = end
    totals = [0.0] * len(pairs)
    greedy = [True] * len(pairs)
    remaining = [0] * len(pairs)  # windows left per pair
    for w in windows:
        remaining[w[0]] += 1
    order = sorted(range(len(windows)), key=lambda w: -len(windows[w][1]))
    at = 0
    while at < len(order):
        width = len(windows[order[at]][1])
        chunk = order[at:at + max(1, SCORE_TOKENS_PER_BATCH // max(width, 1))]
        at += len(chunk)
        idx = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        for row, w in enumerate(chunk):
            inp = windows[w][1]
            idx[row, :len(inp)] = torch.tensor(inp, dtype=torch.long)
        logits = trunk(idx.to(trunk.embed_tokens.weight.device))
        for row, w in enumerate(chunk):
            i, _inp, offset, targets = windows[w]
            lp = F.log_softmax(logits[row, offset:offset + len(targets)].float(), dim=-1)
            target = torch.tensor(targets, dtype=torch.long, device=lp.device)
            totals[i] += float(lp.gather(-1, target[:, None]).sum())
            greedy[i] = greedy[i] and bool((lp.argmax(-1) == target).all())
            remaining[i] -= 1
            if on_done is not None and remaining[i] == 0:
                on_done(1)
    return list(zip(totals, greedy))


def scored_continuation(context: str, continuation: str) -> str:
    """The text whose tokens TemplateLM scores for (context, continuation): it moves the context's
    trailing whitespace into the continuation (`TemplateLM._encode_pair`)."""
    stripped = context.rstrip()
    return context[len(stripped):] + continuation
