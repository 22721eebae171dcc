"""Per-sandbox host directories (the agent's socket lives here) and the labels they carry."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from controlplane.errors import ConfigError

LABELS_FILE = "labels.json"
SOCKET_NAME = "agent.sock"
_MAX_UNIX_PATH = 107


class SandboxDirs:
    """`DATA_DIR/sandboxes/<id>/`: private (0700) host dirs, one per sandbox."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "sandboxes"
        probe = self.socket_path("x" * 12)
        if len(str(probe)) > _MAX_UNIX_PATH:
            raise ConfigError(f"data_dir {data_dir} is too long for a Unix socket path; choose a shorter one")

    def path(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id

    def socket_path(self, sandbox_id: str) -> Path:
        return self.path(sandbox_id) / SOCKET_NAME

    def create(self, sandbox_id: str, labels: dict[str, str]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(sandbox_id)
        path.mkdir(mode=0o700, exist_ok=True)
        self.write_labels(sandbox_id, labels)
        return path

    def write_labels(self, sandbox_id: str, labels: dict[str, str]) -> None:
        target = self.path(sandbox_id) / LABELS_FILE
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(labels, sort_keys=True))
        os.replace(tmp, target)

    def read_labels(self, sandbox_id: str) -> dict[str, str]:
        try:
            data = json.loads((self.path(sandbox_id) / LABELS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def remove(self, sandbox_id: str) -> None:
        shutil.rmtree(self.path(sandbox_id), ignore_errors=True)

    def list_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.name for p in self.root.iterdir() if p.is_dir()]
