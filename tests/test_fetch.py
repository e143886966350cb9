"""Fetch / verify / cache layer: every download path against local file:// fixtures."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

import raylf.data
from raylf.data.cache import (
    MARKER,
    DatasetMissing,
    data_root,
    fetch,
    is_complete,
    require,
    verify,
)
from raylf.data.manifest import DatasetError, FileSpec, Manifest, list_manifests, load_manifest
from raylf.datasets import main

SHIPPED = {
    "mnist",
    "fashion_mnist",
    "cifar10",
    "cifar100",
    "shakespeare",
    "pneumonia",
    "breast_ultrasound",
}


# ------------------------------------------------------------------------------------------
# fixtures


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return buf.getvalue()


MEMBERS = {"toy/data_batch_1": b"a" * 5000, "toy/meta": b"labels"}
PLAIN = b"plain file contents\n" * 100


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    """A folder acting as the remote server."""
    src = tmp_path / "server"
    src.mkdir()
    (src / "toy.tar.gz").write_bytes(_tar_gz(MEMBERS))
    (src / "readme.txt").write_bytes(PLAIN)
    return src


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _manifest(
    src: Path, *, files: list[dict] | None = None, name: str = "toy", **extra
) -> Manifest:
    if files is None:
        archive = (src / "toy.tar.gz").read_bytes()
        files = [
            {
                "url": (src / "toy.tar.gz").as_uri(),
                "filename": "toy.tar.gz",
                "sha256": _sha256(archive),
                "extract": True,
                "size": len(archive),
            },
            {"url": (src / "readme.txt").as_uri(), "filename": "readme.txt", "md5": _md5(PLAIN)},
        ]
    fields = {
        "name": name,
        "description": "toy",
        "licence": "CC0",
        "citation": "none",
        "homepage": "https://example.org",
        "input_shape": [1, 2, 2],
        "tasks": {"t": ["a", "b"]},
        "files": files,
        **extra,
    }
    return Manifest.model_validate(fields)


def _leftovers(folder: Path) -> list[str]:
    """Temporary files or folders an interrupted or failed fetch could leave."""
    if not folder.exists():
        return []
    return sorted(
        p.name
        for p in folder.rglob("*")
        if p.name.endswith((".part", ".extracting")) or ".old-" in p.name
    )


# ------------------------------------------------------------------------------------------
# the happy path


def test_fetch_verifies_extracts_and_marks(source: Path, root: Path) -> None:
    m = _manifest(source)
    folder = fetch("toy", root=root, manifest=m)
    assert folder == root / "toy"
    assert (folder / "toy.tar.gz").is_file()
    assert (folder / "readme.txt").read_bytes() == PLAIN
    for name, payload in MEMBERS.items():
        assert (folder / "toy" / name).read_bytes() == payload
    marker = json.loads((folder / MARKER).read_text())
    assert marker["name"] == "toy"
    recorded = {f["filename"]: f for f in marker["files"]}
    assert recorded["toy.tar.gz"]["sha256"] == m.files[0].sha256
    assert recorded["toy.tar.gz"]["extracted_to"] == "toy"
    assert recorded["readme.txt"]["md5"] == _md5(PLAIN)
    assert _leftovers(folder) == []
    assert require("toy", root=root, manifest=m) == folder
    assert is_complete("toy", root=root, manifest=m)
    assert verify("toy", root=root, manifest=m) == folder


def test_refetch_is_a_noop(source: Path, root: Path) -> None:
    m = _manifest(source)
    folder = fetch("toy", root=root, manifest=m)
    before = (folder / MARKER).stat().st_mtime_ns
    for p in source.iterdir():  # the "server" is gone: a re-download would fail
        p.unlink()
    assert fetch("toy", root=root, manifest=m) == folder
    assert (folder / MARKER).stat().st_mtime_ns == before


def test_files_present_are_verified_and_reused(source: Path, root: Path) -> None:
    """Manual placement: the right bytes under the final name are used without a download."""
    m = _manifest(source)
    folder = root / "toy"
    folder.mkdir(parents=True)
    (folder / "toy.tar.gz").write_bytes((source / "toy.tar.gz").read_bytes())
    (folder / "readme.txt").write_bytes(PLAIN)
    for p in source.iterdir():
        p.unlink()
    fetch("toy", root=root, manifest=m)
    assert (folder / "toy" / "toy" / "meta").read_bytes() == b"labels"
    assert require("toy", root=root, manifest=m) == folder


def test_plain_gz_is_decompressed(tmp_path: Path, root: Path) -> None:
    payload = bytes(range(256)) * 40
    packed = gzip.compress(payload)
    (tmp_path / "x-idx3-ubyte.gz").write_bytes(packed)
    m = _manifest(
        tmp_path,
        files=[
            {
                "url": (tmp_path / "x-idx3-ubyte.gz").as_uri(),
                "filename": "x-idx3-ubyte.gz",
                "md5": _md5(packed),
                "extract": True,
            }
        ],
    )
    folder = fetch("toy", root=root, manifest=m)
    assert (folder / "x-idx3-ubyte").read_bytes() == payload


def test_zip_is_extracted(tmp_path: Path, root: Path) -> None:
    data = _zip({"100.txt": b"ROMEO. hello\n"})
    (tmp_path / "w.zip").write_bytes(data)
    m = _manifest(
        tmp_path,
        files=[
            {
                "url": (tmp_path / "w.zip").as_uri(),
                "filename": "w.zip",
                "sha256": _sha256(data),
                "extract": True,
                "extract_to": "text",
            }
        ],
    )
    folder = fetch("toy", root=root, manifest=m)
    assert (folder / "text" / "100.txt").read_bytes() == b"ROMEO. hello\n"


def test_mirror_is_tried_when_primary_fails(source: Path, root: Path) -> None:
    archive = (source / "toy.tar.gz").read_bytes()
    m = _manifest(
        source,
        files=[
            {
                "url": (source / "missing.tar.gz").as_uri(),
                "mirrors": [(source / "toy.tar.gz").as_uri()],
                "filename": "toy.tar.gz",
                "md5": _md5(archive),
                "extract": True,
            }
        ],
    )
    folder = fetch("toy", root=root, manifest=m)
    assert (folder / "toy" / "toy" / "meta").is_file()


def test_unreachable_everywhere_is_a_clear_error(source: Path, root: Path) -> None:
    m = _manifest(
        source,
        files=[
            {
                "url": (source / "nope.txt").as_uri(),
                "filename": "nope.txt",
                "md5": _md5(b"x"),
            }
        ],
    )
    with pytest.raises(DatasetError, match="could not download nope.txt"):
        fetch("toy", root=root, manifest=m)
    assert not (root / "toy").exists()


# ------------------------------------------------------------------------------------------
# integrity failures leave nothing usable-looking behind


def _assert_nothing_usable(root: Path) -> None:
    folder = root / "toy"
    if folder.exists():
        assert not (folder / MARKER).exists()
        assert not (folder / "toy.tar.gz").exists()
        assert not (folder / "toy").exists()
        assert _leftovers(folder) == []
    if root.exists():  # only the lock file may remain next to the dataset folder
        assert {p.name for p in root.iterdir()} <= {"toy", ".toy.lock"}


def test_wrong_checksum_is_rejected(source: Path, root: Path) -> None:
    archive = (source / "toy.tar.gz").read_bytes()
    wrong = "0" * 64
    m = _manifest(
        source,
        files=[
            {
                "url": (source / "toy.tar.gz").as_uri(),
                "filename": "toy.tar.gz",
                "sha256": wrong,
                "extract": True,
            }
        ],
    )
    with pytest.raises(DatasetError) as err:
        fetch("toy", root=root, manifest=m)
    msg = str(err.value)
    assert "checksum mismatch" in msg
    assert f"expected sha256 {wrong}" in msg
    assert f"actual sha256 {_sha256(archive)}" in msg
    _assert_nothing_usable(root)
    with pytest.raises(DatasetMissing):
        require("toy", root=root, manifest=m)


def test_wrong_md5_shows_md5(source: Path, root: Path) -> None:
    m = _manifest(
        source,
        files=[
            {
                "url": (source / "readme.txt").as_uri(),
                "filename": "readme.txt",
                "md5": "f" * 32,
            }
        ],
    )
    with pytest.raises(DatasetError, match=f"expected md5 {'f' * 32}, actual md5 {_md5(PLAIN)}"):
        fetch("toy", root=root, manifest=m)
    assert not (root / "toy" / "readme.txt").exists()


@pytest.mark.parametrize("with_size", [True, False])
def test_truncated_download_is_rejected(source: Path, root: Path, with_size: bool) -> None:
    m = _manifest(source)  # digests and size of the full archive
    full = (source / "toy.tar.gz").read_bytes()
    (source / "toy.tar.gz").write_bytes(full[: len(full) // 2])  # the server serves half
    if not with_size:
        spec = m.files[0].model_copy(update={"size": None})
        m = m.model_copy(update={"files": [spec, m.files[1]]})
    with pytest.raises(DatasetError) as err:
        fetch("toy", root=root, manifest=m)
    msg = str(err.value)
    if with_size:
        assert f"expected {len(full)} bytes, got {len(full) // 2}" in msg
        assert "truncated" in msg
    else:
        assert f"expected sha256 {_sha256(full)}" in msg
        assert f"actual sha256 {_sha256(full[: len(full) // 2])}" in msg
    _assert_nothing_usable(root)


def test_broken_archive_is_rejected(tmp_path: Path, root: Path) -> None:
    """The digest matches (a manifest recorded a broken file) but the archive cannot be read."""
    junk = b"this is not a gzip stream" * 10
    (tmp_path / "bad.tar.gz").write_bytes(junk)
    m = _manifest(
        tmp_path,
        files=[
            {
                "url": (tmp_path / "bad.tar.gz").as_uri(),
                "filename": "bad.tar.gz",
                "md5": _md5(junk),
                "extract": True,
            }
        ],
    )
    with pytest.raises(DatasetError, match="broken archive bad.tar.gz"):
        fetch("toy", root=root, manifest=m)
    folder = root / "toy"
    assert not (folder / "bad").exists()
    assert not (folder / "bad.tar.gz").exists()
    assert not (folder / MARKER).exists()
    assert _leftovers(folder) == []


def test_a_full_disk_while_unpacking_keeps_the_verified_download(
    source: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a broken archive is removed: a write the disk refuses (here every file the tar
    unpacks, as a full disk does) says nothing about the archive, which stays verified, so the
    next fetch unpacks it without a download. (tests/faults/test_data_faults.py fills a real
    disk.)"""
    import errno

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    m = _manifest(source)
    with monkeypatch.context() as patch:
        patch.setattr(tarfile.TarFile, "makefile", full_disk)
        with pytest.raises(DatasetError) as err:
            fetch("toy", root=root, manifest=m)
    msg = str(err.value)
    assert "cannot unpack toy.tar.gz" in msg and "No space left on device" in msg
    assert "verified download was kept" in msg and "broken archive" not in msg
    folder = root / "toy"
    assert (folder / "toy.tar.gz").read_bytes() == (source / "toy.tar.gz").read_bytes()
    assert not (folder / MARKER).exists() and not (folder / "toy").exists()
    assert _leftovers(folder) == []
    (source / "toy.tar.gz").unlink()  # no second download: the kept archive is unpacked
    fetch("toy", root=root, manifest=m)
    assert (folder / "toy" / "toy" / "data_batch_1").read_bytes() == MEMBERS["toy/data_batch_1"]


def test_unsafe_archive_member_is_rejected(tmp_path: Path, root: Path) -> None:
    evil = _tar_gz({"../escape.txt": b"x"})
    (tmp_path / "evil.tar.gz").write_bytes(evil)
    m = _manifest(
        tmp_path,
        files=[
            {
                "url": (tmp_path / "evil.tar.gz").as_uri(),
                "filename": "evil.tar.gz",
                "md5": _md5(evil),
                "extract": True,
            }
        ],
    )
    with pytest.raises(DatasetError, match="unsafe path"):
        fetch("toy", root=root, manifest=m)
    assert not (root / "escape.txt").exists()
    assert not (root / "toy" / "evil").exists()


def test_placed_file_with_wrong_bytes_is_replaced(source: Path, root: Path) -> None:
    m = _manifest(source)
    folder = root / "toy"
    folder.mkdir(parents=True)
    (folder / "readme.txt").write_bytes(b"corrupted")
    fetch("toy", root=root, manifest=m)
    assert (folder / "readme.txt").read_bytes() == PLAIN


def test_changed_manifest_digest_invalidates_marker(source: Path, root: Path) -> None:
    m = _manifest(source)
    fetch("toy", root=root, manifest=m)
    spec = m.files[1].model_copy(update={"md5": "e" * 32})
    changed = m.model_copy(update={"files": [m.files[0], spec]})
    assert not is_complete("toy", root=root, manifest=changed)
    with pytest.raises(DatasetMissing):
        require("toy", root=root, manifest=changed)
    with pytest.raises(DatasetError, match="checksum mismatch"):
        fetch("toy", root=root, manifest=changed)
    assert not ((root / "toy") / MARKER).exists()


# ------------------------------------------------------------------------------------------
# unverified data


def test_unverified_files_are_refused_unless_allowed(source: Path, root: Path) -> None:
    files = [{"url": (source / "readme.txt").as_uri(), "filename": "readme.txt"}]
    with pytest.raises(ValidationError, match="note"):
        _manifest(source, files=files)  # no digest and no note saying why
    m = _manifest(source, files=files, note="digest unverified: none is published")
    with pytest.raises(DatasetError, match="allow_unverified") as err:
        fetch("toy", root=root, manifest=m)
    assert "readme.txt" in str(err.value)
    assert not (root / "toy").exists()
    with pytest.raises(DatasetMissing) as err2:
        require("toy", root=root, manifest=m)
    assert "--allow-unverified" in str(err2.value)
    folder = fetch("toy", root=root, manifest=m, allow_unverified=True)
    assert (folder / "readme.txt").read_bytes() == PLAIN
    marker = json.loads((folder / MARKER).read_text())
    assert marker["verified"] is False
    assert marker["files"][0]["sha256"] == _sha256(PLAIN)


# ------------------------------------------------------------------------------------------
# require, roots, manifests


def test_require_absent_says_how_to_fetch(source: Path, root: Path) -> None:
    m = _manifest(source)
    with pytest.raises(DatasetMissing) as err:
        require("toy", root=root, manifest=m)
    msg = str(err.value)
    assert f"python -m raylf.datasets fetch toy --root {root.absolute()}" in msg
    assert "toy.tar.gz" in msg and m.files[0].sha256 in msg
    assert "readme.txt" in msg and _md5(PLAIN) in msg
    assert str(root.absolute() / "toy") in msg
    assert isinstance(err.value, DatasetError)


def test_require_shipped_manifest_absent(root: Path) -> None:
    with pytest.raises(DatasetMissing) as err:
        require("cifar10", root=root)
    msg = str(err.value)
    assert "python -m raylf.datasets fetch cifar10 --root" in msg
    assert "c58f30108f718f92721af3b95e74349a" in msg
    assert "cifar-10-python.tar.gz" in msg


def test_data_root_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYLF_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "raylf" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data_root() == Path.home() / ".cache" / "raylf" / "data"
    monkeypatch.setenv("RAYLF_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "explicit") == tmp_path / "explicit"


def test_raylf_data_env_is_honoured(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_root = tmp_path / "from_env"
    monkeypatch.setenv("RAYLF_DATA", str(env_root))
    m = _manifest(source)
    folder = fetch("toy", manifest=m)
    assert folder == env_root / "toy"
    assert require("toy", manifest=m) == folder
    with pytest.raises(DatasetMissing):
        require("toy", root=tmp_path / "elsewhere", manifest=m)


def test_manifest_name_must_match(source: Path, root: Path) -> None:
    with pytest.raises(DatasetError, match="not 'other'"):
        fetch("other", root=root, manifest=_manifest(source))


def test_every_shipped_manifest_loads() -> None:
    names = {p.stem for p in (Path(raylf.data.__file__).parent / "manifests").glob("*.yaml")}
    assert SHIPPED <= names
    loaded = {m.name: m for m in list_manifests()}
    assert set(loaded) == names
    for name in names:
        m = load_manifest(name)
        assert m == loaded[name]
        assert m.files and m.tasks and m.licence and m.citation and m.homepage
        for spec in m.files:
            assert spec.url.startswith(("https://", "http://"))
            if not spec.verified:  # every missing digest is explained
                assert "unverified" in (m.note or "").lower()


def test_shipped_manifest_contents() -> None:
    assert load_manifest("mnist").verified and load_manifest("fashion_mnist").verified
    assert load_manifest("cifar10").files[0].md5 == "c58f30108f718f92721af3b95e74349a"
    assert load_manifest("cifar100").files[0].md5 == "eb9058c3a382ffc7106e4002c42a8d85"
    c100 = load_manifest("cifar100").tasks
    assert len(c100["fine"]) == 100 and len(c100["coarse"]) == 20
    shakespeare = load_manifest("shakespeare")
    assert len(shakespeare.tasks["next_char"]) == 80
    assert shakespeare.tasks["next_char"][0] == "\n"
    for name, binary, multi in (
        ("pneumonia", "pneumonia", "disease_class"),
        ("breast_ultrasound", "malignancy", "case_category"),
    ):
        m = load_manifest(name)
        assert m.input_shape[1:] == [64, 64]
        assert len(m.tasks[binary]) == 2 and len(m.tasks[multi]) == 3
        assert not m.verified  # no citable digest: must stay refused by default


def test_unknown_name_lists_known() -> None:
    with pytest.raises(DatasetError) as err:
        load_manifest("imagenet")
    msg = str(err.value)
    assert "imagenet" in msg
    for name in SHIPPED:
        assert name in msg
    with pytest.raises(DatasetError, match="Known datasets"):
        load_manifest("../etc/passwd")


@pytest.mark.parametrize(
    "bad",
    [
        {"md5": "xyz"},
        {"sha256": "ab" * 31},
        {"url": "ftp://example.org/a.txt"},
        {"filename": "../a.txt"},
        {"filename": "a.txt", "extract": True},
        {"extract_to": "x"},
        {"unknown_field": 1},
        {"members": [{"path": "x/a", "md5": "0" * 32}]},  # not an archive
        {"filename": "a.gz", "extract": True, "members": [{"path": "a", "md5": "0" * 32}]},
        {"filename": "a.zip", "extract": True, "members": [{"path": "x/../a", "md5": "0" * 32}]},
        {"filename": "a.zip", "extract": True, "members": [{"path": "x/a"}]},  # no digest
        {"filename": "a.zip", "extract": True,
         "members": [{"path": "x/a", "md5": "0" * 32}, {"path": "x/a", "md5": "1" * 32}]},
    ],
)
def test_filespec_validation(bad: dict) -> None:
    fields = {"url": "https://example.org/a.txt", "filename": "a.txt", "md5": "0" * 32, **bad}
    with pytest.raises(ValidationError):
        FileSpec.model_validate(fields)


def test_manifest_rejects_unknown_fields_and_clashes(source: Path) -> None:
    with pytest.raises(ValidationError):
        _manifest(source, colour="blue")
    spec = {"url": "https://example.org/a", "filename": "a.txt", "md5": "0" * 32}
    with pytest.raises(ValidationError, match="same name"):
        _manifest(source, files=[spec, spec])


def test_cli_fetch_and_path(source: Path, root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["path", "mnist", "--root", str(root)]) == 1
    assert "python -m raylf.datasets fetch mnist" in capsys.readouterr().err
    assert main(["fetch", "shakespeare", "--root", str(root)]) == 1  # unverified: refused
    assert "allow_unverified" in capsys.readouterr().err
    assert main(["list", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "cifar10" in out and "absent" in out


# ------------------------------------------------------------------------------------------
# http:// against a local server (one that can also lie about Content-Length)


@pytest.fixture()
def http_server(source: Path):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            name = self.path.lstrip("/")
            short = name.startswith("short/")
            path = source / name.removeprefix("short/")
            if not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2] if short else data)
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_http_download(source: Path, root: Path, http_server: str) -> None:
    archive = (source / "toy.tar.gz").read_bytes()
    m = _manifest(
        source,
        files=[
            {
                "url": f"{http_server}/missing.tar.gz",  # 404: falls through to the mirror
                "mirrors": [f"{http_server}/toy.tar.gz"],
                "filename": "toy.tar.gz",
                "sha256": _sha256(archive),
                "extract": True,
            }
        ],
    )
    folder = fetch("toy", root=root, manifest=m)
    assert (folder / "toy" / "toy" / "meta").read_bytes() == b"labels"


def test_http_connection_cut_short_is_rejected(source: Path, root: Path, http_server: str) -> None:
    archive = (source / "toy.tar.gz").read_bytes()
    m = _manifest(
        source,
        files=[
            {
                "url": f"{http_server}/short/toy.tar.gz",
                "filename": "toy.tar.gz",
                "sha256": _sha256(archive),
                "extract": True,
            }
        ],
    )
    with pytest.raises(DatasetError) as err:
        fetch("toy", root=root, manifest=m)
    msg = str(err.value)
    assert "broke off" in msg or "truncated" in msg
    _assert_nothing_usable(root)


# ------------------------------------------------------------------------------------------
# a rejected archive leaves the cache as it was


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under the cache root and its bytes; fetch's lock files aside."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


@pytest.mark.parametrize("fault", ["corrupt", "truncated", "wrong-checksum"])
def test_rejected_archive_leaves_the_cache_untouched(
    source: Path, tmp_path: Path, root: Path, fault: str
) -> None:
    """Another dataset already in the cache keeps every byte; nothing of the rejected one is
    left, not even a partial file."""
    other = _manifest(source, name="other")
    fetch("other", root=root, manifest=other)
    before = _snapshot(root)
    m = _manifest(source)  # size and sha256 of the good archive
    archive = (source / "toy.tar.gz").read_bytes()
    if fault == "corrupt":  # one byte flipped in the middle: same size, other content
        middle = len(archive) // 2
        bad = archive[:middle] + bytes([archive[middle] ^ 0xFF]) + archive[middle + 1:]
        (source / "toy.tar.gz").write_bytes(bad)
        expected = f"actual sha256 {_sha256(bad)}"
    elif fault == "truncated":
        (source / "toy.tar.gz").write_bytes(archive[: len(archive) // 3])
        expected = f"truncated download of toy.tar.gz: expected {len(archive)} bytes"
    else:
        spec = m.files[0].model_copy(update={"sha256": "1" * 64})
        m = m.model_copy(update={"files": [spec, m.files[1]]})
        expected = f"expected sha256 {'1' * 64}, actual sha256 {_sha256(archive)}"
    with pytest.raises(DatasetError) as err:
        fetch("toy", root=root, manifest=m)
    assert expected in str(err.value)
    assert _snapshot(root) == before
    assert not (root / "toy").exists()
    assert is_complete("other", root=root, manifest=other)


def _with_members(spec: dict, members: dict[str, bytes]) -> dict:
    return {**spec, "members": [{"path": p, "md5": _md5(b)} for p, b in members.items()]}


def test_archive_whose_unpacked_files_do_not_match_the_manifest_is_rejected(
    source: Path, root: Path
) -> None:
    """The archive's own digest is right, but a file it unpacks to is not what the manifest
    lists (or is absent): nothing is unpacked into place and the archive goes."""
    archive = _manifest(source).files[0].model_dump(exclude_defaults=True)
    listed = {"toy/data_batch_1": b"b" * 5000, "toy/meta": MEMBERS["toy/meta"]}
    m = _manifest(source, files=[_with_members(archive, listed)])
    with pytest.raises(DatasetError) as err:
        fetch("toy", root=root, manifest=m)
    msg = str(err.value)
    assert f"checksum mismatch for toy/data_batch_1 in toy.tar.gz: expected md5 " \
           f"{_md5(b'b' * 5000)}, actual md5 {_md5(MEMBERS['toy/data_batch_1'])}" in msg
    assert "the archive was removed" in msg
    _assert_nothing_usable(root)
    absent = _manifest(source, files=[_with_members(archive, {**MEMBERS, "toy/labels": b"x"})])
    with pytest.raises(DatasetError, match="toy.tar.gz lacks toy/labels"):
        fetch("toy", root=root, manifest=absent)
    _assert_nothing_usable(root)
    folder = fetch("toy", root=root, manifest=_manifest(source, files=[
        _with_members(archive, MEMBERS)]))
    assert (folder / "toy" / "toy" / "meta").read_bytes() == MEMBERS["toy/meta"]


# ------------------------------------------------------------------------------------------
# CIFAR's pickles are read only once they hashed to the manifest's digests


class _Canary:
    """Unpickling this creates a folder: proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return os.mkdir, (str(self.path),)


def _fake_cifar10(server: Path) -> tuple[Manifest, dict[str, bytes]]:
    """A CIFAR-10 archive of two images per batch and the shipped manifest pointed at it, with
    its md5s (the shipped ones describe the real archive)."""
    import pickle

    import numpy as np

    rng = np.random.default_rng(0)
    batches = {f"cifar-10-batches-py/{name}": pickle.dumps(
        {"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), "labels": [i % 10, 9]})
        for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"])}
    batches["cifar-10-batches-py/batches.meta"] = pickle.dumps(
        {"label_names": [f"c{i}" for i in range(10)]})
    archive = _tar_gz(batches)
    (server / "cifar-10-python.tar.gz").write_bytes(archive)
    shipped = load_manifest("cifar10")
    spec = shipped.files[0].model_copy(update={
        "url": (server / "cifar-10-python.tar.gz").as_uri(), "md5": _md5(archive), "size": None,
        "members": [member.model_copy(update={"md5": _md5(batches[member.path])})
                    for member in shipped.files[0].members]})
    assert {m.path for m in spec.members} == set(batches)  # the shipped manifest lists them all
    return shipped.model_copy(update={"files": [spec]}), batches


@pytest.fixture()
def fake_cifar10(source: Path, root: Path, monkeypatch: pytest.MonkeyPatch):
    """CIFAR-10 fetched into the cache from a fake archive; the cache reads the fake manifest."""
    from raylf.data import cache

    manifest, batches = _fake_cifar10(source)
    monkeypatch.setattr(cache, "load_manifest",
                        lambda name: manifest if name == "cifar10" else load_manifest(name))
    folder = fetch("cifar10", root=root)
    return folder / "cifar-10-python", batches


def _load_cifar10(root: Path):
    from raylf.data.sources import SOURCES, load_source

    return load_source("cifar10", SOURCES.get("cifar10").Params(root=str(root)))


def test_cifar_batches_swapped_after_the_fetch_are_never_unpickled(
    fake_cifar10, root: Path, tmp_path: Path
) -> None:
    unpacked, batches = fake_cifar10
    data = _load_cifar10(root)
    assert data.x.shape == (12, 3, 32, 32) and data.class_names == [f"c{i}" for i in range(10)]
    canary = tmp_path / "unpickled"
    swapped = unpacked / "cifar-10-batches-py" / "data_batch_3"
    swapped.write_bytes(__import__("pickle").dumps(_Canary(canary)))
    with pytest.raises(DatasetError) as err:
        _load_cifar10(root)
    assert not canary.exists()
    msg = str(err.value)
    assert f"checksum mismatch for {swapped}: expected md5 " \
           f"{_md5(batches['cifar-10-batches-py/data_batch_3'])}" in msg
    repair = f"python -m raylf.datasets fetch cifar10 --force --root {root.absolute()}"
    assert "it was not read" in msg and repair in msg
    with pytest.raises(DatasetError, match="checksum mismatch") as verified:
        verify("cifar10", root=root)
    assert repair in str(verified.value)
    fetch("cifar10", root=root, force=True)  # the repair the message names
    assert np_equal(_load_cifar10(root).x, data.x) and not canary.exists()


def _python2_pickle(obj) -> bytes:
    """``obj`` pickled as the real CIFAR archives were, by Python 2: protocol 2, byte strings as
    Python 2's ``str`` (BINSTRING, where Python 3 would call ``_codecs.encode``) and numpy's
    reconstructor under its old module, ``numpy.core.multiarray``."""
    import pickle
    import struct

    class Python2(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_bytes(self, data: bytes) -> None:
            if len(data) < 256:
                self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
            else:
                self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
            self.memoize(data)

        dispatch[bytes] = save_bytes

    buffer = io.BytesIO()
    Python2(buffer, protocol=2).dump(obj)
    return buffer.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def test_cifar_pickles_load_with_no_global_but_numpys_arrays(tmp_path: Path) -> None:
    """The restricted unpickler reads the real archives' format (a Python 2 batch); a pickle
    that names any other global is refused before that global is called."""
    import pickle

    import numpy as np

    from raylf.data.sources import CifarUnpickler

    rows = np.random.default_rng(0).integers(0, 256, (4, 3072), dtype=np.uint8)
    batch = _python2_pickle({b"batch_label": b"training batch 1 of 5", b"labels": [3, 1, 4, 1],
                             b"data": rows, b"filenames": [b"a.png", b"b.png", b"c.png",
                                                            b"d.png"]})
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in batch and b"_codecs" not in batch
    loaded = CifarUnpickler(io.BytesIO(batch), encoding="latin1").load()
    assert np.array_equal(loaded["data"], rows) and loaded["labels"] == [3, 1, 4, 1]
    assert loaded["batch_label"] == "training batch 1 of 5"
    canary = tmp_path / "unpickled"
    for forged in (pickle.dumps(_Canary(canary)), _python2_pickle(_Canary(canary))):
        with pytest.raises(pickle.UnpicklingError, match=r"refers to (posix|nt)\.mkdir"):
            CifarUnpickler(io.BytesIO(forged), encoding="latin1").load()
    assert not canary.exists()


def np_equal(a, b) -> bool:
    import numpy as np

    return bool(np.array_equal(a, b))


def test_missing_cifar_batch_names_the_file_and_the_repair(fake_cifar10, root: Path) -> None:
    unpacked, _ = fake_cifar10
    (unpacked / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DatasetError) as err:
        _load_cifar10(root)
    msg = str(err.value)
    assert f"cannot read {unpacked / 'cifar-10-batches-py' / 'test_batch'}" in msg
    assert "fetch cifar10 --force" in msg


def test_tampered_cifar_batch_is_a_spec_error_before_anything_starts(
    fake_cifar10, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from raylf import run
    from tests.test_bad_input import assert_refused, experiment_file

    unpacked, _ = fake_cifar10
    (unpacked / "cifar-10-batches-py" / "batches.meta").write_bytes(b"\x80\x04N.")
    spec = experiment_file(tmp_path, dataset={"name": "cifar10", "root": str(root)},
                           model={"name": "mlp", "hidden": [8]})
    code = run.main([str(spec), "--out", str(tmp_path / "out"), "--backend", "local"])
    assert_refused(code, capsys.readouterr().err, "dataset.name",
                   "fetch cifar10 --force", tmp_path / "out")


@pytest.mark.parametrize("name, reader", [("cifar10", "CIFAR10"), ("cifar100", "CIFAR100")])
def test_shipped_member_digests_are_torchvisions(name: str, reader: str) -> None:
    """The md5s of the pickled files, as torchvision publishes them."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, reader)
    published = {f"{cls.base_folder}/{f}": md5 for f, md5 in cls.train_list + cls.test_list}
    published[f"{cls.base_folder}/{cls.meta['filename']}"] = cls.meta["md5"]
    (spec,) = load_manifest(name).files
    assert {m.path: m.md5 for m in spec.members} == published
    assert spec.md5 == cls.tgz_md5


# ------------------------------------------------------------------------------------------
# a damaged manifest says how to repair it


@pytest.mark.parametrize("text, problem", [
    ("name: cifar10\nfiles: [{broken\n", "cannot read manifest"),
    ("- a list\n", "must be a mapping"),
    ("name: cifar10\n", "description: Field required"),
])
def test_damaged_manifest_names_the_file_the_problem_and_the_repair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, problem: str
) -> None:
    from raylf.data import manifest

    monkeypatch.setattr(manifest, "manifest_folder", lambda: tmp_path)
    (tmp_path / "cifar10.yaml").write_text(text)
    with pytest.raises(DatasetError) as err:
        load_manifest("cifar10")
    msg = str(err.value)
    assert str(tmp_path / "cifar10.yaml") in msg and problem in msg
    assert "git checkout -- raylf/data/manifests/cifar10.yaml" in msg
    assert "pip install --force-reinstall --no-deps raylf" in msg
    assert "\n" not in msg
