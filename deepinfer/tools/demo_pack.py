"""Pack the trained demo pair into parts small enough to travel back from a GPU machine
(at most 15 MB each), and unpack them; standard library only."""
from __future__ import annotations

import hashlib
import io
import math
import os
import shutil
import tarfile
from pathlib import Path

PACK_PART_BYTES = 15_000_000
PACK_MAX_PARTS = 4
PACK_NAME = "demo.tar"

def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def pack(out: Path, packdir: Path, model_dirs: tuple[str, ...]) -> list[Path]:
    """Write PACKDIR/demo.tar.partN (<= 15 MB each, <= 4 parts) + sha256 + the log."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in (*model_dirs, "train_log.json"):
            tar.add(out / name, arcname=name, filter=_tar_filter, recursive=False)
            if (out / name).is_dir():
                for path in sorted((out / name).rglob("*")):
                    tar.add(path, arcname=path.relative_to(out).as_posix(),
                            filter=_tar_filter, recursive=False)
    data = buffer.getvalue()
    parts = math.ceil(len(data) / PACK_PART_BYTES)
    if parts > PACK_MAX_PARTS:
        raise SystemExit(f"pack is {len(data)} bytes: more than {PACK_MAX_PARTS} parts")
    packdir.mkdir(parents=True, exist_ok=True)
    for old in packdir.glob(f"{PACK_NAME}.part*"):
        old.unlink()
    written = []
    for i in range(parts):
        path = packdir / f"{PACK_NAME}.part{i}"
        path.write_bytes(data[i * PACK_PART_BYTES:(i + 1) * PACK_PART_BYTES])
        written.append(path)
    sha = packdir / f"{PACK_NAME}.sha256"
    sha.write_text(f"{hashlib.sha256(data).hexdigest()}  {PACK_NAME}\n")
    shutil.copyfile(out / "train_log.json", packdir / "train_log.json")
    print(f"packed {len(data):,} bytes into {parts} part(s) under {packdir}")
    return [*written, sha, packdir / "train_log.json"]


def unpack(packdir: str | os.PathLike, out: str | os.PathLike, model_dirs: tuple[str, ...]) -> Path:
    """Reassemble PACKDIR/demo.tar.part0.. and extract the model dirs + log into OUT."""
    packdir, out = Path(packdir), Path(out)
    parts = []
    for i in range(PACK_MAX_PARTS + 1):
        path = packdir / f"{PACK_NAME}.part{i}"
        if not path.exists():
            break
        parts.append(path.read_bytes())
    if not parts:
        raise SystemExit(f"no {PACK_NAME}.part0 in {packdir}")
    data = b"".join(parts)
    sha = packdir / f"{PACK_NAME}.sha256"
    if sha.exists():
        expected = sha.read_text().split()[0]
        if hashlib.sha256(data).hexdigest() != expected:
            raise SystemExit(f"{packdir}: sha256 mismatch (missing or corrupt part?)")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        members = tar.getmembers()
        for member in members:
            top = member.name.split("/")[0]
            if (member.name.startswith("/") or ".." in member.name.split("/")
                    or top not in (*model_dirs, "train_log.json")
                    or not (member.isfile() or member.isdir())):
                raise SystemExit(f"refusing suspicious pack member {member.name!r}")
        out.mkdir(parents=True, exist_ok=True)
        for name in model_dirs:
            if (out / name).exists():
                shutil.rmtree(out / name)  # no stale shards from an earlier layout
        for member in members:
            tar.extract(member, out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    print(f"unpacked {len(data):,} bytes from {len(parts)} part(s) into {out}")
    return out
