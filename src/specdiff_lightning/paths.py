"""Where the project keeps what it computes once per machine, and the modes of what it writes for
users (imports nothing heavy)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "cache_root", "give_user_modes"]


def cache_root() -> Path:
    """``$SPECDIFF_CACHE`` or ``~/.cache/specdiff_lightning``: converted models, calibrations."""
    return Path(os.environ.get("SPECDIFF_CACHE", Path.home() / ".cache" / "specdiff_lightning"))


def give_user_modes(path: str | os.PathLike) -> None:
    """Give an export directory and the files in it the modes of the user's umask (0755 / 0644 at
    022), as any file the user writes has: ``mkdtemp`` makes private directories (0700), and
    transformers / safetensors write weights through private temporary files (0600), which another
    user (a serving process, a shared cache) cannot read."""
    umask = _umask()
    path = Path(path)
    os.chmod(path, 0o777 & ~umask)
    for f in path.iterdir():
        if f.is_file():
            os.chmod(f, 0o666 & ~umask)


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Write a file whole or not at all: ``write(tmp)`` writes a temporary file next to ``path``
    (so the rename stays on one filesystem), renamed into place; an interruption leaves the old
    file, never half a new one. The file gets the umask's mode (``mkstemp`` makes it 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _umask() -> int:
    umask = os.umask(0o022)  # os.umask can only be read by setting it: set it straight back
    os.umask(umask)
    return umask
