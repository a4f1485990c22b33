"""Helpers the tests share (configs, recipe TOML, the CLI in and out of process, snapshots); the
fixtures that use them are in conftest.py. Test files import from here, never from each other."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch
from torch import Tensor

from mtp_cli.config.recipe import DataConfig, ModelConfig, MTPConfig, Recipe, TrainConfig
from mtp_cli.decode.generate import probs_from_logits
from mtp_cli.decode.speculative import Drafter

STDLIB = Path(sysconfig.get_paths()["stdlib"])


TINY_FILES = [str(STDLIB / name) for name in ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py")]


def tiny_model_config(**kw) -> ModelConfig:
    # Random residual branches (no zero init): a block that starts as the identity would hide leaks from tests.
    base = dict(vocab_size=512, n_layers=3, d_model=64, n_heads=4, ffn_hidden=128, context=64, zero_init_residual=False)
    base.update(kw)
    return ModelConfig(**base)


def tiny_recipe(objective: str = "ntp", steps: int = 80, **mtp_kw) -> Recipe:
    mtp = MTPConfig(objective=objective, **mtp_kw)
    return Recipe(
        name="tiny",
        model=tiny_model_config(),
        mtp=mtp,
        data=DataConfig(source="files", paths=list(TINY_FILES), tokenizer="bpe"),
        train=TrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup=10, eval_every=40, eval_batches=2, ckpt_every=40,
                          peak_flops=1e11),
    )


REPO = Path(__file__).resolve().parent.parent


def micro_recipe(objective: str = "ntp", steps: int = 4, **mtp_kw) -> Recipe:
    """Smaller than `tiny_recipe`, for tests that train several runs: d_model 32, 3 layers, context 32,
    batch 4, the same 512-token BPE (so the tokenizer/shard cache is shared with `tiny_recipe`)."""
    recipe = tiny_recipe(objective, steps=steps, **mtp_kw)
    recipe.name = "micro"
    recipe.model = tiny_model_config(d_model=32, n_heads=2, ffn_hidden=64, context=32)
    recipe.train = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=2, eval_every=steps, eval_batches=1,
                               ckpt_every=steps, peak_flops=1e11)
    return recipe


def recipe_toml(recipe: Recipe) -> str:
    """TOML text of a recipe's name and model/mtp/data/train sections (None values left out)."""
    return recipe.to_toml()


def write_recipe(recipe: Recipe, path: Path) -> Path:
    path.write_text(recipe_toml(recipe))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m mtp_cli ARGS` in a fresh process: the real entry point, its exit code and stderr.
    The session's isolated MTP_CACHE_DIR is inherited through the environment."""
    return subprocess.run([sys.executable, "-m", "mtp_cli", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout)


def cli_in_process(*args, capsys) -> tuple[int, str, str]:
    """The real CLI entry point, in-process: (exit code, stdout, stderr)."""
    from mtp_cli import cli

    argv, sys.argv = sys.argv, ["mtp", *map(str, args)]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    out = capsys.readouterr()
    return code, out.out, out.err


def folder_snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `folder` (to prove nothing changed)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoint_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(Path(run_dir) / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def max_state_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def ablation_toml(name: str = "micro-abl", seeds=(0,), steps: int = 6, eval_tasks=("heldout", "humaneval", "gsm8k"),
                  specbench: bool = True, variants: str | None = None, extra: str = "",
                  ckpt_every: int | None = None) -> str:
    """A recipe TOML for `mtp ablate` at micro scale: ntp vs sequential D=1 by default, tiny eval limits."""
    files = ", ".join(json.dumps(f) for f in TINY_FILES)
    variants = variants if variants is not None else (
        '[[variants]]\nname = "ntp"\n\n[[variants]]\nname = "seq-d1"\n'
        'mtp = { objective = "sequential", depth = 1, lambda = 0.3 }\n')
    return f"""name = "{name}"


description = "micro ablation for the tests"


seeds = [{", ".join(map(str, seeds))}]


{extra}


[model]


vocab_size = 512


n_layers = 3


d_model = 32


n_heads = 2


ffn_hidden = 64


context = 32


[data]


source = "files"


paths = [{files}]


[train]


steps = {steps}


batch_size = 4


warmup = 2


eval_every = {steps}


eval_batches = 1


ckpt_every = {ckpt_every or max(steps // 2, 1)}


peak_flops = 1e11


[eval]


enabled = {"true" if eval_tasks else "false"}


tasks = [{", ".join(json.dumps(t) for t in eval_tasks)}]


limits = {{ humaneval = 1, gsm8k = 1, heldout = 2 }}


gsm8k_data = {json.dumps(str(REPO / "tests" / "data" / "gsm8k"))}


[specbench]


enabled = {"true" if specbench else "false"}


limit = 1


max_new_tokens = 4


repeats = 2


{variants}"""


class OracleDrafter(Drafter):
    """Drafts `reference[i][g+1 : g+1+k]` for prompt i whose pending token is generated token g:
    with the trunk's own greedy output every draft is right; `wrong=True` shifts every draft id by
    one so none is. Sampling treats the drafts as certain (q one-hot). `engine`: the trunk's, which verifies."""

    def __init__(self, engine, reference: list[list[int]], prompt_lengths: list[int], k: int,
                 vocab_size: int, wrong: bool = False, device: torch.device | str = "cpu"):
        self.engine, self.k, self.vocab_size, self.wrong = engine, k, vocab_size, wrong
        width = max(len(r) for r in reference) + k + 1
        self.ref = torch.zeros(len(reference), width, dtype=torch.long, device=device)
        for i, r in enumerate(reference):
            self.ref[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        self.prompt_lengths = torch.as_tensor(list(prompt_lengths), device=device)
        self.ids = torch.arange(len(reference), device=device)

    def propose(self, seq, lengths, temperature, top_p, generator):
        first = lengths - self.prompt_lengths[self.ids] + 1
        idx = (first[:, None] + torch.arange(self.k, device=lengths.device)).clamp_(max=self.ref.shape[1] - 1)
        drafts = self.ref[self.ids[:, None], idx]
        if self.wrong:
            drafts = (drafts + 1) % self.vocab_size
        q = torch.nn.functional.one_hot(drafts, self.vocab_size).float() if temperature > 0 else None
        return drafts, q

    def select(self, rows: Tensor) -> None:
        self.ids = self.ids[rows]


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's goodness of fit; categories expecting fewer than `min_expected` are pooled."""
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat.double() / 2))


def first_two_token_law(trunk, prompt, temperature):
    """Exact law of generated tokens 1 and 2 under plain sampling: p(t1) and sum_t1 p(t1) p(t2 | t1)."""
    with torch.no_grad():
        p1 = probs_from_logits(trunk(torch.tensor([prompt]))[0, -1], temperature).double()
        V = p1.shape[0]
        batch = torch.cat([torch.tensor([prompt]).expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = probs_from_logits(trunk(batch)[:, -1], temperature).double()
    return p1, p1 @ p2


def random_export_dir(tokenizer_run: Path, out: Path, **config) -> Path:
    """A tiny trunk with large random weights (varied, tie-free greedy output), saved as a Hugging Face
    checkpoint with `tokenizer_run`'s tokenizer, for lm-eval's HFLM."""
    from mtp_cli.model import hf
    from mtp_cli.model.checkpoint import load_run
    from mtp_cli.model.trunk import Trunk, init_weights

    torch.manual_seed(0)
    trunk = Trunk(tiny_model_config(**config))
    init_weights(trunk, 0.3)
    tok = load_run(tokenizer_run).tokenizer
    hf.trunk_to_hf(trunk, tok).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ---- used by tests only (the package has no caller for them) ----------------------------------------

def paired_bootstrap(a, b, iters: int | None = None, seed: int | None = None):
    """mean(a − b) over common items with a 95% paired-bootstrap interval (items resampled once for both):
    the one-seed case of `stats.hierarchical_difference`."""
    from mtp_cli.base import stats

    kwargs = {k: v for k, v in (("iters", iters), ("seed", seed)) if v is not None}
    return stats.hierarchical_difference({0: a}, {0: b}, **kwargs)


def state_bytes_per_rank(params: float, world: int, parallel: str, trained: float | None = None) -> float:
    """Model state per rank in bytes (docs/cluster.md's table): fp32 parameters (4 B), gradients (4 B) and
    AdamW's two moments (8 B) of the `trained` parameters (default: all), 4 B for each frozen one; divided
    by `world` under FSDP. Activations, and under FSDP the gathered working set, come on top."""
    trained = params if trained is None else trained
    total = params * 4 + trained * (4 + 8)
    return total / world if parallel == "fsdp" else total


def generate_texts(trunk, tokenizer, prompts, max_new_tokens: int, **kwargs) -> list[str]:
    """Completions as text (special tokens dropped), not cut at the stop strings."""
    from mtp_cli.decode.batching import encode, generate_ids

    ids = generate_ids(trunk, tokenizer, [encode(tokenizer, p) for p in prompts], max_new_tokens, **kwargs)
    return [tokenizer.decode(x, skip_special_tokens=True) for x in ids]


def one_line_error(code: int, err: str, pattern: str) -> None:
    """Exit 2 and exactly one line on stderr, `error: ...` matching `pattern` (data preparation's own status
    lines, `data: ...`, aside)."""
    import re

    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("data: ")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
