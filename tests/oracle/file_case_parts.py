"""What the file tools' oracle cases (cases_files.py, cases_files_boundaries.py) share: sample bytes, the GPT model
apply_patch needs, and the patch envelope."""

import base64

PNG = "base64:iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
GPT = {"model": "openai/gpt-5"}
"""apply_patch is offered to GPT models only (upstream's debug command looks the tool up in the model's list)."""
CONTROL_HEAVY = "base64:" + base64.b64encode(b"\x01\x02\x03" * 14 + b"plain text " * 6).decode()
BLOCK = "def f(x):\n    a = 1\n    b = 2\n    return a + b\n\n\ndef g(x):\n    c = 3\n    d = 4\n    return c + d\n"


def patch(*lines: str) -> dict[str, str]:
    return {"patchText": "\n".join(["*** Begin Patch", *lines, "*** End Patch"])}


def control_bytes(n: int) -> str:
    """100 sampled bytes of which `n` are control characters (binary when more than 30%)."""
    return "base64:" + base64.b64encode(b"\x01" * n + b"a" * (100 - n)).decode()
