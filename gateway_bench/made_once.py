"""What the bench and the tests make once on a machine and keep in the gateway's cache (the test
adapter, the tiny model, the quantized copies): made in a scratch directory beside its place,
under a lock across processes, and renamed into place whole."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def made_once(
    kept: Path,
    make: Callable[[Path], Path],
    complete: Callable[[Path], bool] = Path.is_dir,
) -> Path:
    """`kept`, made by `make(scratch)` (the directory it made) unless `complete(kept)` holds
    already; by default a directory there is complete, nothing but a whole one being renamed
    into place."""
    from gateway.engine.default_model import file_lock

    if complete(kept):
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(kept.parent / f".{kept.name}.lock"):
        if complete(kept):  # another process made it while this one waited
            return kept
        with tempfile.TemporaryDirectory(dir=kept.parent) as scratch:
            made = make(Path(scratch) / kept.name)
            shutil.rmtree(kept, ignore_errors=True)
            made.rename(kept)
    return kept
