"""Local files a sample names: is it inside its folder, and is it a file to read at all.

Shared by the record formats (`zephon_vl.formats.references`) and WebDataset
videos by reference (`zephon_vl.media.video.video_location`): a path is inside
a folder when its real path (symbolic links resolved) is, and only a regular
file is opened (a FIFO blocks, ``/dev/zero`` never ends, a folder is no
image).
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO (named pipe)"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"))

#: the errors of a path no system call can open, as a sample's fault (not the storage's)
_PATH_ERRORS = {errno.ENAMETOOLONG: "the path is too long to open",
                errno.ENOTDIR: "a part of the path is a file, not a folder",
                errno.ELOOP: "the path runs through a loop of symbolic links"}


def path_fault(exc: OSError) -> str | None:
    """Why `exc` means the path itself cannot name a file (None: another error, e.g. a
    missing file or a failing disk, which is not the sample's fault)."""
    return _PATH_ERRORS.get(exc.errno or 0)


def inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or below it (both already real, absolute paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def real_inside(path: str, folder: str) -> bool:
    """Whether `path` still lies in `folder` once both have their links resolved."""
    return inside(os.path.realpath(path), os.path.realpath(folder))


def file_kind(mode: int) -> str | None:
    """What a non-regular file is (``"FIFO (named pipe)"``...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "special file")
