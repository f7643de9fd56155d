"""One block's file: its key, its token ids and its KV bytes, with a checksum over all three.
Written to a temporary name and renamed, so a reader sees a whole file or none; a file cut short
or changed on disk fails the checks on read and is never served."""
from __future__ import annotations

import hashlib
import os
import struct
from array import array

MAGIC = b"DIKVBLK1"
_HEAD = struct.Struct("<8s16s16sIQ")  # magic, key, checksum, number of tokens, payload bytes


class CorruptBlock(Exception):
    """A block file that is short, malformed, of another key or tokens, or fails its checksum."""


def _checksum(key: bytes, tokens: bytes, payload: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(key, digest_size=16)
    h.update(tokens)
    h.update(payload)
    return h.digest()


def encode(key: bytes, tokens: tuple[int, ...], payload: bytes | memoryview) -> bytes:
    toks = array("q", tokens).tobytes()
    return _HEAD.pack(MAGIC, key, _checksum(key, toks, payload), len(tokens), len(payload)) + toks + payload


def decode(data: bytes, key: bytes, tokens: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], memoryview]:
    """The token ids and KV bytes of a block file's contents; CorruptBlock unless every check holds
    (and, given ``tokens``, they are the file's: a key collision cannot serve another block)."""
    if len(data) < _HEAD.size:
        raise CorruptBlock(f"{len(data)} bytes, shorter than the {_HEAD.size}-byte header")
    magic, fkey, checksum, ntok, nbytes = _HEAD.unpack_from(data)
    if magic != MAGIC or fkey != key:
        raise CorruptBlock("not a block file of this key")
    end = _HEAD.size + 8 * ntok
    if len(data) != end + nbytes:
        raise CorruptBlock(f"{len(data)} bytes where the header says {end + nbytes}: cut short or padded")
    view = memoryview(data)
    toks, payload = view[_HEAD.size:end], view[end:]
    if _checksum(key, toks, payload) != checksum:
        raise CorruptBlock("checksum mismatch")
    ids = array("q")
    ids.frombytes(toks)
    got = tuple(ids)
    if tokens is not None and got != tokens:
        raise CorruptBlock("the file holds other token ids (a key collision)")
    return got, payload


def write_atomic(path: str, data: bytes, fsync: bool) -> None:
    """Write ``data`` at ``path`` through a temporary file in the same directory and a rename."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
