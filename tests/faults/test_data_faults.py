"""A dataset fetch on a disk that fills up while the archive is unpacked: the verified download
is kept (it is not a broken archive), and once there is space the next fetch unpacks it
without downloading it again."""

from __future__ import annotations

import subprocess

import pytest

from raylf.data.cache import MARKER, fetch
from raylf.data.manifest import DatasetError
from tests.test_fetch import _manifest, _tar_gz

UNPACKED = {"toy/big": bytes(2 * 2**20)}  # 2 MiB of zeros: a few KiB compressed


def test_a_disk_that_fills_while_unpacking_keeps_the_verified_download(tmp_path, small_disk):
    source, root = tmp_path / "server", tmp_path / "cache"
    source.mkdir()
    root.mkdir()
    (source / "toy.tar.gz").write_bytes(_tar_gz(UNPACKED))
    (source / "readme.txt").write_bytes(b"plain file contents\n" * 100)
    manifest = _manifest(source)
    small_disk(root, 1)
    with pytest.raises(DatasetError) as err:
        fetch("toy", root=root, manifest=manifest)
    msg = str(err.value)
    assert "cannot unpack toy.tar.gz" in msg and "No space left on device" in msg
    assert "verified download was kept" in msg
    folder = root / "toy"
    assert (folder / "toy.tar.gz").read_bytes() == (source / "toy.tar.gz").read_bytes()
    assert not (folder / MARKER).exists()
    subprocess.run(["mount", "-o", "remount,size=8m", str(root)], check=True)  # space freed
    (source / "toy.tar.gz").unlink()  # so a second download would fail
    fetch("toy", root=root, manifest=manifest)
    assert (folder / "toy" / "toy" / "big").stat().st_size == 2 * 2**20
