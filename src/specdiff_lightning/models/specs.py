"""What a model spec string names: a known name, a tiny preset, a local directory or a hub id.

:func:`resolve_pretrained` is the one place a spec becomes something ``from_pretrained`` reads, so
verifiers, tokenizers and drafters accept the same names everywhere (configs, CLI, Python). It fails
at once, listing the known names, where a spec can only be a hub id and no hub can be reached:
transformers would otherwise spend ~45 s in retries before a vague "couldn't connect".
"""

from __future__ import annotations

import functools
import os

from .smollm2 import SMOLLM2_SPEC, smollm2_dir

__all__ = [
    "TINY_PREFIX",
    "TINY_PRESETS",
    "NAMED_VERIFIERS",
    "known_specs",
    "resolve_pretrained",
    "hub_reachable",
    "hub_offline",
]

TINY_PREFIX = "tiny-"
#: the tiny presets (random small models of the real classes, :mod:`specdiff_lightning.models.tiny`)
TINY_PRESETS = ("tiny-qwen2", "tiny-llama")

#: named verifiers: spec -> a function returning a local Hugging Face directory (converted and cached
#: on first use). Every config and CLI command that takes a verifier or tokenizer spec accepts these.
NAMED_VERIFIERS = {SMOLLM2_SPEC: smollm2_dir}

#: seconds the hub gets to answer one HEAD request before it counts as unreachable
_HUB_TIMEOUT_S = 3.0
_TRUE = {"1", "on", "yes", "true"}


def known_specs() -> list[str]:
    """Every spec that needs neither a directory nor a hub: the named verifiers and tiny presets."""
    return [*NAMED_VERIFIERS, *TINY_PRESETS]


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set, now or when huggingface_hub was imported."""
    import huggingface_hub.constants as hub

    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return bool(hub.HF_HUB_OFFLINE) or any(os.environ.get(k, "").strip().lower() in _TRUE for k in names)


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face endpoint (``HF_ENDPOINT``, proxies honoured) answers one HEAD request
    within a few seconds; asked once per process. Not asked when offline mode is set."""
    import huggingface_hub.constants as hub
    from huggingface_hub.utils import get_session

    try:
        response = get_session().head(hub.ENDPOINT, timeout=_HUB_TIMEOUT_S)
    except Exception:  # noqa: BLE001 (DNS, refused, timeout, offline mode: all mean "not reachable")
        return False
    return response.status_code < 500


def _looks_like_a_path(spec: str) -> bool:
    # a hub id is "name" or "owner/name"; anything else is meant as a local path
    return spec.startswith((".", "/", "~")) or "\\" in spec or spec.count("/") > 1 or os.path.exists(spec)


def _not_found(spec: str, what: str, why: str) -> ValueError:
    return ValueError(
        f"{what} {spec!r} is neither a known name ({', '.join(known_specs())}) nor a local directory{why}; "
        f"pass one of those names or the directory of a Hugging Face checkpoint"
    )


def resolve_pretrained(
    spec: str | os.PathLike, what: str = "model", filename: str = "config.json", **hub_kwargs
) -> str:
    """The local directory or hub id ``from_pretrained`` should read for a spec that names files.

    Args:
        spec: a name in :data:`NAMED_VERIFIERS` (its cached directory), a local directory, or a hub
            id (``owner/name``). Tiny presets have no files: callers build them before resolving.
        what: what the spec is for, in error messages (``"verifier"``, ``"tokenizer"``...).
        filename: a file the checkpoint has, looked up in the local hub cache when no hub answers.
        hub_kwargs: ``cache_dir`` / ``revision`` of that look-up.

    A hub id found in the local hub cache while no hub answers resolves to its cached snapshot
    directory: transformers then never asks the hub (even ``local_files_only=True`` still retries a
    PEFT adapter look-up for ~23 s). A spec that cannot name anything here is a one-line ``ValueError``.
    """
    spec = os.fspath(spec)
    if spec in NAMED_VERIFIERS:
        return str(NAMED_VERIFIERS[spec]())
    if spec.startswith(TINY_PREFIX):
        raise ValueError(f"{what} {spec!r} is a tiny preset (a random model): it has no files to load")
    if os.path.isdir(spec):
        return spec
    if _looks_like_a_path(spec):
        why = " (no such directory)" if not os.path.exists(spec) else " (a file, not a directory)"
        raise _not_found(spec, what, why)
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise _not_found(spec, what, " (nor a valid hub id)") from None
    offline = hub_offline()
    if not offline and hub_reachable():
        return spec
    lookup = {k: hub_kwargs[k] for k in ("cache_dir", "revision") if hub_kwargs.get(k) is not None}
    cached = try_to_load_from_cache(spec, filename, **lookup)
    if isinstance(cached, str):
        return os.path.dirname(cached)
    hub = "offline mode is set (HF_HUB_OFFLINE)" if offline else "no Hugging Face hub is reachable"
    raise _not_found(spec, what, f", and {hub} to fetch it as a hub id (it is not in the local hub cache)")
