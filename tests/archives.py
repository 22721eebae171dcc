"""Workspace archives for tests: a tar of named files (text or bytes), mode 0644, mtime now."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Mapping


def tar_of(files: Mapping[str, str | bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
