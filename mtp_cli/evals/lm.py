"""An lm-eval model class backed by our trunk and batched KV-cache decoder (`--model mtp`).

lm-eval's `HFLM` on the export gives the same answers (a test checks it on a small `--limit`);
this class is what `mtp eval` uses because it batches generation with ragged prompts, a KV
cache and finished rows leaving the batch. It follows HFLM's conventions: prompts encoded with the
tokenizer's own special-token rule, EOS added to the stop strings, output cut at the first stop
string, loglikelihoods through lm-eval's `TemplateLM` (context/continuation split, rolling
windows). One deliberate difference: generation never truncates the prompt unless `max_length`
is given (HFLM then left-truncates to max_length - max_gen_toks, as here); positions past the
trained context rely on RoPE extrapolation, which `mtp eval` reports.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

from mtp_cli.decode.batching import BATCH_SIZE, encode, generate_ids

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default, as HFLM


@register_model("mtp")
class MTPLM(TemplateLM):
    def __init__(self, pretrained: str | None = None, trunk=None, tokenizer=None, batch_size: int = BATCH_SIZE,
                 max_length: int | None = None, seed: int = 0, progress=None, compile: bool | None = None, **_ignored):
        super().__init__()
        if pretrained is not None:
            from mtp_cli.model.hf import load_export
            trunk, tokenizer = load_export(pretrained)
        if trunk is None or tokenizer is None:
            raise ValueError("MTPLM needs pretrained=EXPORT_DIR, or trunk= and tokenizer=")
        self.trunk, self.tokenizer = trunk.eval(), tokenizer
        self.batch_size = int(batch_size)
        self._max_length = int(max_length) if max_length else None
        self.generator = torch.Generator().manual_seed(int(seed))
        self.progress = progress
        self.compile = compile  # the decoder's torch.compile switch (None: the device's default)
        self.prompt_lengths: list[int] = []  # token lengths of every generation prompt seen

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
            prompts = [self.tok_encode(requests[i].args[0]) for i in indices]
            if self._max_length:
                keep = self._max_length - max_gen
                if keep <= 0:
                    raise ValueError(f"max_gen_toks {max_gen} must be below max_length {self._max_length}")
                prompts = [p[-keep:] for p in prompts]
            self.prompt_lengths += [len(p) for p in prompts]
            ids = generate_ids(self.trunk, self.tokenizer, prompts, max_gen, temperature=temperature, top_p=top_p,
                               stops=until, generator=self.generator, batch_size=self.batch_size, compile=self.compile,
                               progress=None if disable_tqdm else self.progress, description="gsm8k: generate")
            for i, completion in zip(indices, ids):
                text = self.tokenizer.decode(completion, skip_special_tokens=True)
                out[i] = postprocess_generated_text(text, until, None)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out  # type: ignore[return-value]

    # ---- likelihoods (TemplateLM turns these into loglikelihood and loglikelihood_rolling) ------
    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None) -> list[tuple[float, bool]]:
        window = self.max_length + 1
        seqs = []
        for _key, context, continuation in requests:
            whole = (list(context) + list(continuation))[-window:]
            seqs.append((whole, len(continuation)))
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0]))
        results: list[tuple[float, bool] | None] = [None] * len(seqs)
        bs = override_bs or self.batch_size
        for start in range(0, len(order), bs):
            chunk = order[start:start + bs]
            width = max(len(seqs[i][0]) for i in chunk) - 1
            idx = torch.full((len(chunk), max(width, 1)), self.eot_token_id, dtype=torch.long)
            for row, i in enumerate(chunk):
                inp = seqs[i][0][:-1]
                idx[row, :len(inp)] = torch.tensor(inp, dtype=torch.long)
            logits = self.trunk(idx)
            for row, i in enumerate(chunk):
                whole, n_cont = seqs[i]
                end = len(whole) - 1
                lp = F.log_softmax(logits[row, end - n_cont:end].float(), dim=-1)
                target = torch.tensor(whole[-n_cont:], dtype=torch.long)
                total = float(lp.gather(-1, target[:, None]).sum())
                results[i] = (total, bool((lp.argmax(-1) == target).all()))
                self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval import utils

        out = []
        for req in requests:
            windows = [(None,) + utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
                token_list=self.tok_encode(req.args[0]), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            out.append(sum(ll for ll, _ in self._loglikelihood_tokens(windows, disable_tqdm=True)))
        return out

