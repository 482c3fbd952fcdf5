"""A `Location`'s local backend: a folder reached through `pyarrow.fs.LocalFileSystem`, written atomically.

A write goes to a complete, fsynced temp file beside its target, then is renamed over it (atomic on POSIX), so
readers never see a torn file; a first-writer-wins create hard-links that temp file instead; a copy between local
folders is a hard link. A disk does not come back: nothing here is retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
from pyarrow import fs as pafs
from tenacity import stop_after_attempt
from tenacity.stop import stop_base

if TYPE_CHECKING:
    from longeval.store.location import CopyKind, Location

__all__ = ["TMP_SUFFIX", "LocalBackend"]

log = logging.getLogger(__name__)

T = TypeVar("T")

TMP_SUFFIX = ".tmp"
"""A local atomic write's temp file is `.<name>.<random>.tmp` beside its target (dot-named: listings skip it)."""


class LocalBackend:
    """What a `Location` on a local folder does its own way (`location.Backend` lists the hooks)."""

    kind = "local"
    bucket = ""
    """A folder has no bucket (`Location.bucket`)."""
    endpoint = None
    """Nor an S3 endpoint (`Location.endpoint`)."""

    def make_fs(self, at: Location) -> pafs.FileSystem:
        return pafs.LocalFileSystem()

    def stop(self, at: Location) -> stop_base:
        """One try: a local error is not a server restarting."""
        return stop_after_attempt(1)

    # -- operations -----------------------------------------------------------------------------------------

    def is_file(self, at: Location, rel: str) -> bool:
        return at.fs.get_file_info(at.full(rel)).type == pafs.FileType.File

    def list(self, at: Location, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """List with `allow_not_found`, surviving pyarrow's local race: when a folder is created between its
        failed listing and the existence check after it, pyarrow raises FileNotFoundError although the folder
        is there (seen with racing lease claims). Asking again lists it."""
        try:
            return at.fs.get_file_info(selector)
        except FileNotFoundError:
            return at.fs.get_file_info(selector)

    def check_empty(self, at: Location, rel: str) -> None:
        """An empty listing of a local folder means what it says (a missing folder lists as empty, as it should)."""

    def read(self, at: Location, rel: str) -> bytes:
        with at.fs.open_input_stream(at.full(rel)) as f:
            return f.read()

    def write(self, at: Location, rel: str, data: bytes | pa.Buffer) -> None:
        """Write to a temp file beside the target, fsync, then rename over it (atomic on POSIX)."""
        self._publish_temp(at, rel, data, "write", os.replace)

    def create(self, at: Location, rel: str, data: bytes) -> bool:
        """A complete temp file hard-linked to the target: `link` fails if the name exists, and readers never see
        a partial file."""

        def link(tmp: Path, final: Path) -> bool:
            try:
                os.link(tmp, final)
            except FileExistsError:
                return False
            return True

        return self._publish_temp(at, rel, data, "create", link)

    def touch(self, at: Location, rel: str) -> None:
        at.call(f"touch {at.path(rel)}", os.utime, at.full(rel))

    def same_store(self, other: object) -> bool:
        """Whether a copy from `other` can be a hard link: another local folder (a byte copy when linking fails)."""
        return isinstance(other, LocalBackend)

    def copy_in(self, at: Location, to_rel: str, source: Location, rel: str) -> CopyKind:
        """Hard-link the source to a temp name beside the target, then rename it over the target (atomic); copy the
        bytes instead when the filesystem refuses the link."""
        path = Path(source.full(rel))
        final = Path(at.base, to_rel)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
        how: CopyKind = "link"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, tmp)
            except FileNotFoundError:
                raise
            except OSError as exc:  # another device (EXDEV), no links on this filesystem, a protected source
                log.debug("cannot hard-link %s to %s (%s); copying its bytes", path, final, exc)
                with open(path, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                    dst.flush()
                    os.fsync(dst.fileno())
                how = "copy"
            os.replace(tmp, final)
        except OSError as exc:
            raise at.error(f"copy {path} to {final}", exc) from exc
        finally:
            with contextlib.suppress(OSError):  # gone after the rename (or still there: `final` was the same file)
                tmp.unlink(missing_ok=True)
        return how

    # -- errors -----------------------------------------------------------------------------------------------

    def hint(self, exc: OSError) -> str:
        """What to check after a failed local operation."""
        if isinstance(exc, PermissionError):
            return "check the folder's permissions or pick a run root you can write"
        if isinstance(exc, FileNotFoundError):
            return "the file does not exist; is this the right run root, and did the stage finish?"
        return "check the path, free disk space and permissions"

    # -- temp files -------------------------------------------------------------------------------------------

    def _publish_temp(self, at: Location, rel: str, data: bytes | pa.Buffer, what: str,
                      publish: Callable[[Path, Path], T]) -> T:
        """Write `data` whole to a temp file beside `rel`, fsync it, then `publish(tmp, final)`: readers never see
        a partial file, and the temp file is gone afterwards whatever happened."""
        final = Path(at.base, rel)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return publish(tmp, final)
        except OSError as exc:
            raise at.error(f"{what} {final}", exc) from exc
        finally:
            with contextlib.suppress(OSError):  # gone after a rename, or the folder never existed
                tmp.unlink(missing_ok=True)
