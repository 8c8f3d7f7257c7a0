"""Turning the base wheel plus staged files into the custom wheel, byte for byte reproducibly."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from pathlib import Path

from .base import BaseSpec
from .common import DynapatchError, log

# Every entry gets this timestamp, so the archive does not depend on when it was built.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
COMPRESS_LEVEL = 6


def stamp_version_py(text: str, spec: BaseSpec, series_sha256: str) -> str:
    """torch/version.py with the patched version and the series hash recorded."""
    old = f"__version__ = '{spec.version}'"
    if old not in text:
        raise DynapatchError(f"torch/version.py does not contain {old!r}: is the base wheel right?")
    text = text.replace(old, f"__version__ = '{spec.patched_version}'")
    return text + (
        "\n# Stamped by dynapatch: this torch carries a Dynamo patch series.\n"
        f"dynapatch_base = '{spec.version}'\n"
        f"dynapatch_series = '{series_sha256}'\n"
    )


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _entry_order(name: str) -> tuple:
    # Wheel convention: .dist-info last, RECORD at the very end.
    in_dist_info = ".dist-info/" in name
    return (in_dist_info, name.endswith(".dist-info/RECORD"), name)


def repack(base_wheel: Path, out_wheel: Path, spec: BaseSpec, staged: dict[str, bytes]) -> None:
    """Write `out_wheel`: the base wheel's entries with `staged` (path -> bytes) replacing or
    adding files, the dist-info renamed to the patched version, and RECORD regenerated.

    Entries are sorted and carry a fixed timestamp and mode, so equal inputs give equal bytes.
    """
    old_info = f"torch-{spec.version}.dist-info/"
    new_info = f"torch-{spec.patched_version}.dist-info/"
    tmp = out_wheel.with_name(out_wheel.name + ".partial")
    with zipfile.ZipFile(base_wheel) as src:
        infos = {i.filename: i for i in src.infolist() if not i.is_dir()}
        if old_info + "METADATA" not in infos:
            raise DynapatchError(f"{base_wheel.name} has no {old_info}METADATA")
        names = {n.replace(old_info, new_info, 1): n for n in infos}
        for rel in staged:
            names.setdefault(rel, None)
        names.pop(new_info + "RECORD", None)
        record_lines = []
        try:
            with zipfile.ZipFile(tmp, "w") as dst:
                for name in sorted(names, key=_entry_order):
                    old = names[name]
                    if name in staged:
                        data = staged[name]
                    else:
                        data = src.read(old)
                    if name == new_info + "METADATA":
                        data = re.sub(rb"^Version: .*$", f"Version: {spec.patched_version}".encode(),
                                      data, count=1, flags=re.M)
                    mode = 0o755 if name.endswith(".so") or (old and (infos[old].external_attr >> 16) & 0o111) else 0o644
                    _write(dst, name, data, mode)
                    record_lines.append(f"{name},{_record_hash(data)},{len(data)}")
                record_lines.append(f"{new_info}RECORD,,")
                _write(dst, new_info + "RECORD", ("\n".join(record_lines) + "\n").encode(), 0o644)
            os.replace(tmp, out_wheel)
        finally:
            tmp.unlink(missing_ok=True)
    log(f"wrote {out_wheel} ({out_wheel.stat().st_size / 1e6:.1f} MB)")


def _write(dst: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
    info.create_system = 3  # unix, so external_attr carries the mode
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(info, data, compresslevel=COMPRESS_LEVEL)


def patched_wheel_name(spec: BaseSpec) -> str:
    """The base wheel's file name with the patched version; the tags stay as they were."""
    prefix = f"torch-{spec.version}-"
    if not spec.wheel.startswith(prefix):
        raise DynapatchError(f"patches/BASE wheel {spec.wheel} does not start with {prefix}")
    return f"torch-{spec.patched_version}-" + spec.wheel[len(prefix):]
