"""Archives that unpack to far more than they weigh, built by the tests (nothing downloaded): a .tar.gz of about
1 MiB holding a 1 GiB file, the same spread over many members, a zip whose one member is 1 GiB.

Deflate of a MiB of zeros, flushed fully (Z_FULL_FLUSH resets the compressor), is the same ~1 KiB every time,
so a gigabyte of zeros is 1,024 copies of one block in a single, valid deflate stream: built in about a second
(most of it the CRC-32 the gzip and zip formats carry), where compressing the gigabyte takes twenty.
"""

from __future__ import annotations

import struct
import tarfile
import zlib
from pathlib import Path

MiB = 2**20
_ZEROS = bytes(MiB)


class _Deflated:
    """A raw deflate stream written piece by piece, with the CRC-32 and length of what it holds."""

    def __init__(self) -> None:
        self._compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        self._zeros = b""  # the deflate of one MiB of zeros, once the compressor has been reset
        self.parts: list[bytes] = []
        self.crc = 0
        self.size = 0

    def add(self, data: bytes) -> None:
        self.parts.append(self._compressor.compress(data) + self._compressor.flush(zlib.Z_FULL_FLUSH))
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)

    def add_zeros(self, mib: int) -> None:
        if not self._zeros:
            self._zeros = self._compressor.compress(_ZEROS) + self._compressor.flush(zlib.Z_FULL_FLUSH)
            mib -= 1
            self.parts.append(self._zeros)
            self.crc = zlib.crc32(_ZEROS, self.crc)
            self.size += MiB
        for _ in range(mib):
            self.parts.append(self._zeros)
            self.crc = zlib.crc32(_ZEROS, self.crc)
            self.size += MiB

    def finish(self) -> bytes:
        self.parts.append(self._compressor.flush(zlib.Z_FINISH))
        return b"".join(self.parts)


def _tar_header(name: str, size: int, kind: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def tar_gz_bomb(path: Path, members: int = 1, mib_each: int = 1024, kind: bytes = tarfile.REGTYPE) -> Path:
    """A .tar.gz of `members` files `main<i>.tf` of `mib_each` MiB of zeros each (one of 1 GiB by default);
    `kind` XHDTYPE makes the (first) member a pax header of that size, which a tar reader reads whole."""
    stream = _Deflated()
    for i in range(members):
        stream.add(_tar_header(f"main{i}.tf" if members > 1 else "main.tf", mib_each * MiB, kind if i == 0 else
                               tarfile.REGTYPE))
        stream.add_zeros(mib_each)
    stream.add(bytes(2 * tarfile.BLOCKSIZE))  # the end of the archive
    gzip_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    path.write_bytes(gzip_header + stream.finish() + struct.pack("<II", stream.crc, stream.size & 0xFFFFFFFF))
    return path


def zip_bomb(path: Path, mib: int = 1024) -> Path:
    """A zip of one deflated member `main.tf`, `mib` MiB of zeros, with its true sizes and CRC."""
    stream = _Deflated()
    stream.add_zeros(mib)
    data = stream.finish()
    name = b"main.tf"
    fields = struct.pack("<HHHHHIII", 20, 0, 8, 0, 0x21, stream.crc, len(data), stream.size)  # version..sizes
    local = b"PK\x03\x04" + fields + struct.pack("<HH", len(name), 0) + name
    central = (b"PK\x01\x02" + struct.pack("<H", 20) + fields + struct.pack("<HHHHHII", len(name), 0, 0, 0, 0,
                                                                            0o100644 << 16, 0) + name)
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    path.write_bytes(local + data + central + end)
    return path
