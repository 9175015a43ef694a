"""Unpacking a module package's archive (.zip, .tar.gz, .tgz, .tar) as hostile input: a branch chooses the server.

A 1 MiB .tar.gz can unpack to 1 GiB, a zip's central directory can name millions of entries (zipfile builds an
object of ~500 bytes for each before anything else can be checked), and tarfile reads a pax or GNU long-name
header whole. So, each bound refused (`ArchiveRefused`, one line) before the bytes past it are read or written:

- members: `ArchiveLimits.members` entries of any kind (files, folders, links), a zip's counted in its central
  directory before zipfile reads it, which may itself be no larger than `directory_bytes`;
- unpacked bytes: `ArchiveLimits.unpacked_bytes`, checked against each member's declared size before it is
  written (a 1 GiB member is refused by its header) and against the bytes as they are written; for a tar, the
  whole decompressed stream (headers included) is bounded the same, and tarfile is never let read more than
  `record_bytes` at once.

Only regular files and folders are written, none outside `dest`; after a refusal nothing written is left.
The archive's own size is the download's bound (`ArchiveLimits.archive_bytes`, counted as it arrives: see
module_fetch).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

from gateway.adapters.modules.access import ArchiveLimits, MiB, one_line

_CHUNK = 64 * 1024
_UNREADABLE = (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


class _Seekable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...

    def seek(self, offset: int, whence: int = ..., /) -> int: ...


class ArchiveRefused(Exception):
    """An archive that is not unpacked: over a limit, unreadable, or a member outside the package (one line)."""


def extract_archive(archive: IO[bytes], kind: str, dest: Path, limits: ArchiveLimits) -> None:
    """Unpack a zip or tar (gzip, bzip2 or xz compressed, or not) from a seekable file into `dest`, within
    `limits`: regular files and folders only, none outside `dest`; on a refusal `dest` is left as it was found."""
    existed = dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "zip":
            _extract_zip(archive, dest, limits)
        else:
            _extract_tar(archive, dest, limits)
    except _UNREADABLE as exc:
        _remove_written(dest, existed)
        raise ArchiveRefused(f"not a readable {kind} archive ({one_line(exc)})") from exc
    except BaseException:
        _remove_written(dest, existed)
        raise


def _extract_zip(archive: IO[bytes], dest: Path, limits: ArchiveLimits) -> None:
    _count_zip_entries(archive, limits)
    with zipfile.ZipFile(archive) as zipped:
        if len(zipped.infolist()) > limits.members:  # zipfile found another directory than the count read
            raise _too_many(limits)
        members = [m for m in zipped.infolist() if not m.is_dir() and not _is_zip_link(m)]
        _within(sum(m.file_size for m in members), limits)  # declared: refused before a byte is written
        written = 0
        for member in members:
            with zipped.open(member) as content:
                written = _write_member(dest, member.filename, content, written, limits)


def _count_zip_entries(archive: IO[bytes], limits: ArchiveLimits) -> None:
    """Refuse a zip whose central directory holds more than `limits.members` entries, counted where zipfile will
    read them, without building anything: the end record found as zipfile finds it (the last 22 bytes, else the
    last signature in the 64 KiB a comment may take), the directory ending where it (or the zip64 one) begins."""
    end = archive.seek(0, os.SEEK_END)
    start = max(0, end - (22 + 0xFFFF))
    archive.seek(start)
    tail = archive.read()
    plain = tail[-22:]
    at = len(tail) - 22 if plain[:4] == b"PK\x05\x06" and plain[-2:] == b"\0\0" else tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        raise zipfile.BadZipFile("no end of central directory record")
    size = struct.unpack_from("<I", tail, at + 12)[0]
    record = start + at
    if at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":  # zip64: its end record sits before the locator
        archive.seek(max(0, record - 20 - 56))
        zip64 = archive.read(56)
        if zip64[:4] != b"PK\x06\x06":
            raise zipfile.BadZipFile("a zip64 locator without its end record")
        size = struct.unpack_from("<Q", zip64, 40)[0]
        record -= 20 + 56
    if size > limits.directory_bytes:
        raise ArchiveRefused(f"archive's zip directory is larger than {limits.directory_bytes // MiB} MiB")
    if size > record:
        raise zipfile.BadZipFile("the central directory is larger than the archive")
    archive.seek(record - size)
    directory = archive.read(size)
    count = offset = 0
    while offset < size:
        if directory[offset:offset + 4] != b"PK\x01\x02" or offset + 46 > size:
            raise zipfile.BadZipFile("a broken central directory entry")
        name, extra, comment = struct.unpack_from("<HHH", directory, offset + 28)
        offset += 46 + name + extra + comment
        count += 1
        if count > limits.members:
            raise _too_many(limits)
    archive.seek(0)


def _is_zip_link(member: zipfile.ZipInfo) -> bool:
    return (member.external_attr >> 16) & 0o170000 == 0o120000


def _extract_tar(archive: IO[bytes], dest: Path, limits: ArchiveLimits) -> None:
    stream = _BoundedStream(_decompressed(archive), limits)
    with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
        written = count = 0
        for member in tar:
            count += 1
            if count > limits.members:
                raise _too_many(limits)
            if not member.isfile():
                continue  # folders are made for the files in them; links, devices and fifos are never written
            _within(written + member.size, limits)  # declared: a 1 GiB member is refused by its header
            content = tar.extractfile(member)
            if content is not None:
                written = _write_member(dest, member.name, content, written, limits)


def _decompressed(archive: IO[bytes]) -> _Seekable:
    """The tar inside (gzip, bzip2 and xz known by their magic bytes, as tarfile's `r:*` knows them)."""
    archive.seek(0)
    magic = archive.read(6)
    archive.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=archive, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(archive)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(archive)
    return archive


class _BoundedStream:
    """The decompressed tar as tarfile reads it: never past `unpacked_bytes` from its start, and never more than
    `record_bytes` in one read, so a header tarfile reads whole cannot make it hold a gigabyte."""

    def __init__(self, inner: _Seekable, limits: ArchiveLimits):
        self.inner = inner
        self.limits = limits
        self.position = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.limits.record_bytes:
            raise ArchiveRefused(f"archive holds a tar record larger than {self.limits.record_bytes // MiB} MiB")
        _within(self.position + size, self.limits)
        data = self.inner.read(size)
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset if whence == os.SEEK_SET else self.position + offset
        if whence not in (os.SEEK_SET, os.SEEK_CUR) or target < 0:
            raise OSError("the archive is read forwards from its start")
        _within(target, self.limits)  # skipping a member decompresses it too
        self.inner.seek(target)
        self.position = target
        return target

    def tell(self) -> int:
        return self.position


def _write_member(dest: Path, name: str, content: IO[bytes], written: int, limits: ArchiveLimits) -> int:
    """Copy one member under `dest`, counting its bytes against the limit as they come; the new running total."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts:
        raise ArchiveRefused(f"archive member {name!r} would land outside the module")
    target = dest.joinpath(*[p for p in path.parts if p not in ("", ".")])
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        while chunk := content.read(_CHUNK):
            written += len(chunk)
            _within(written, limits)
            out.write(chunk)
    return written


def _within(unpacked: int, limits: ArchiveLimits) -> None:
    if unpacked > limits.unpacked_bytes:
        raise ArchiveRefused(f"archive unpacks to more than {limits.unpacked_bytes // MiB} MiB")


def _too_many(limits: ArchiveLimits) -> ArchiveRefused:
    return ArchiveRefused(f"archive holds more than {limits.members} members")


def _remove_written(dest: Path, existed: bool) -> None:
    if not existed:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for path in dest.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

