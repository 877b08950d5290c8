"""gateway_bench/made_once.py: a cached directory is made once, whole, and kept."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


def test_a_directory_is_made_once_and_kept(tmp_path: Path) -> None:
    from gateway_bench.made_once import made_once

    calls: list[Path] = []

    def make(scratch: Path) -> Path:
        calls.append(scratch)
        scratch.mkdir()
        (scratch / "weights").write_text("made")
        return scratch

    kept = tmp_path / "cache" / "thing-r1"
    assert made_once(kept, make) == kept
    assert made_once(kept, make) == kept
    assert len(calls) == 1 and calls[0].parent != kept.parent  # made in a scratch directory
    assert (kept / "weights").read_text() == "made"
    assert sorted(p.name for p in kept.parent.iterdir()) == [".thing-r1.lock", "thing-r1"]


def test_a_directory_that_is_not_complete_is_made_again(tmp_path: Path) -> None:
    from gateway_bench.made_once import made_once

    kept = tmp_path / "thing"
    (kept / "stale").mkdir(parents=True)

    def make(scratch: Path) -> Path:
        (scratch / "done").mkdir(parents=True)
        return scratch

    made_once(kept, make, lambda path: (path / "done").is_dir())
    assert sorted(p.name for p in kept.iterdir()) == ["done"]


def test_a_failed_make_leaves_nothing_in_place(tmp_path: Path) -> None:
    from gateway_bench.made_once import made_once

    def make(scratch: Path) -> Path:
        scratch.mkdir()
        raise RuntimeError("the recipe failed")

    kept = tmp_path / "thing"
    with pytest.raises(RuntimeError):
        made_once(kept, make)
    assert not kept.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".thing.lock"]
