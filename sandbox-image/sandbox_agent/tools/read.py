"""The `read` tool: a file as numbered lines, a directory as entries, an image or PDF as an attachment."""

from __future__ import annotations

import base64
import codecs
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from opencode_semantics.javascript import js_number
from sandbox_agent.tools.base import (
    IO_NOW_BYTES,
    Attachment,
    ToolContext,
    ToolError,
    ToolOutput,
    stat_or_none,
)
from sandbox_agent.tools.collation import locale_key, utf16_length, utf16_prefix
from sandbox_agent.tools.paths import (
    as_given,
    assert_external_directory,
    checked_target,
    node_dirname,
    outside_project,
    path_names,
    relative_to_worktree,
)
from sandbox_agent.tools.safe_open import Target, inspect, open_checked, read_bytes

DEFAULT_LIMIT = 2000
MAX_LINE_LENGTH = 2000
LINE_SUFFIX = f"... (line truncated to {MAX_LINE_LENGTH} chars)"
MAX_BYTES = 50 * 1024
PREVIEW_LINES = 20
INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md", "CONTEXT.md")

BINARY_EXTENSIONS = frozenset({
    ".zip", ".tar", ".gz", ".exe", ".dll", ".so", ".class", ".jar", ".war", ".7z", ".doc", ".docx", ".xls",
    ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp", ".bin", ".dat", ".obj", ".o", ".a", ".lib", ".wasm",
    ".pyc", ".pyo",
})
# Extension -> mime of every file sent as an attachment, as v1.2.27's read tool reports them when executed
# (not Bun.file().type, which says image/x-ms-bmp for .bmp and image/x-icon for .ico). svg, svgz and fbs are
# image types there too but are read as text.
MEDIA_TYPES = {
    ".3ds": "image/x-3ds", ".apng": "image/apng", ".avci": "image/avci", ".avcs": "image/avcs", ".avif": "image/avif",
    ".azv": "image/vnd.airzip.accelerator.azv", ".b16": "image/vnd.pco.b16", ".bmp": "image/bmp",
    ".btf": "image/prs.btif", ".btif": "image/prs.btif", ".cgm": "image/cgm", ".cmx": "image/x-cmx",
    ".dds": "image/vnd.ms-dds", ".dib": "image/bmp", ".djv": "image/vnd.djvu", ".djvu": "image/vnd.djvu",
    ".dng": "image/x-adobe-dng", ".dpx": "image/dpx", ".drle": "image/dicom-rle", ".dwg": "image/vnd.dwg",
    ".dxf": "image/vnd.dxf", ".emf": "image/emf", ".exr": "image/aces", ".fh": "image/x-freehand",
    ".fh4": "image/x-freehand", ".fh5": "image/x-freehand", ".fh7": "image/x-freehand", ".fhc": "image/x-freehand",
    ".fits": "image/fits", ".fpx": "image/vnd.fpx", ".fst": "image/vnd.fst", ".g3": "image/g3fax", ".gif": "image/gif",
    ".heic": "image/heic", ".heics": "image/heic-sequence", ".heif": "image/heif", ".heifs": "image/heif-sequence",
    ".hej2": "image/hej2k", ".ico": "image/vnd.microsoft.icon", ".ief": "image/ief", ".jfif": "image/pjpeg",
    ".jhc": "image/jphc", ".jls": "image/jls", ".jng": "image/x-jng", ".jp2": "image/jp2", ".jpe": "image/jpeg",
    ".jpeg": "image/jpeg", ".jpf": "image/jpx", ".jpg": "image/jpeg", ".jpg2": "image/jp2", ".jpgm": "image/jpm",
    ".jph": "image/jph", ".jpm": "image/jpm", ".jpx": "image/jpx", ".jxl": "image/jxl", ".jxr": "image/jxr",
    ".jxra": "image/jxra", ".jxrs": "image/jxrs", ".jxs": "image/jxs", ".jxsc": "image/jxsc", ".jxsi": "image/jxsi",
    ".jxss": "image/jxss", ".ktx": "image/ktx", ".ktx2": "image/ktx2", ".mdi": "image/vnd.ms-modi",
    ".mmr": "image/vnd.fujixerox.edmics-mmr", ".npx": "image/vnd.net-fpx", ".pbm": "image/x-portable-bitmap",
    ".pct": "image/x-pict", ".pcx": "image/vnd.zbrush.pcx", ".pdf": "application/pdf",
    ".pgm": "image/x-portable-graymap", ".pic": "image/x-pict", ".png": "image/png", ".pnm": "image/x-portable-anymap",
    ".ppm": "image/x-portable-pixmap", ".psd": "image/vnd.adobe.photoshop", ".pti": "image/prs.pti",
    ".ras": "image/x-cmu-raster", ".rgb": "image/x-rgb", ".rlc": "image/vnd.fujixerox.edmics-rlc", ".sgi": "image/sgi",
    ".sid": "image/x-mrsid-image", ".t38": "image/t38", ".tap": "image/vnd.tencent.tap", ".tfx": "image/tiff-fx",
    ".tga": "image/x-tga", ".tif": "image/tiff", ".tiff": "image/tiff", ".uvg": "image/vnd.dece.graphic",
    ".uvi": "image/vnd.dece.graphic", ".uvvg": "image/vnd.dece.graphic", ".uvvi": "image/vnd.dece.graphic",
    ".vtf": "image/vnd.valve.source.texture", ".wbmp": "image/vnd.wap.wbmp", ".wdp": "image/vnd.ms-photo",
    ".webp": "image/webp", ".wmf": "image/wmf", ".xbm": "image/x-xbitmap", ".xif": "image/vnd.xiff",
    ".xpm": "image/x-xpixmap", ".xwd": "image/x-xwindowdump",
}
SAMPLE_SIZE = 4096
CHUNK_SIZE = 1 << 20
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Enough of a line to render it exactly: more than MAX_LINE_LENGTH code points always means the cut applies.
_KEEP_CHARS = MAX_LINE_LENGTH + 1


@dataclass
class _Missing:
    suggestions: list[str]


@dataclass
class _Directory:
    entries: list[str]


@dataclass
class _Media:
    mime: str
    data: bytes
    instructions: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class _Binary:
    pass


@dataclass
class _Text:
    lines: list[str]
    count: int
    cut: bool
    more: bool
    instructions: list[tuple[str, str]] = field(default_factory=list)


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    given = args.get("offset")
    if given is not None and given < 1:  # before the whole-number check, as upstream
        raise ToolError("offset must be greater than or equal to 1")
    offset = _whole(given, "offset")
    limit = _whole(args.get("limit"), "limit")
    offset = 1 if offset is None else offset
    limit = DEFAULT_LIMIT if limit is None else limit

    path = as_given(ctx, str(args["filePath"]))
    title = relative_to_worktree(ctx, path)
    # Resolved once: the asks name where the path really leads, and the file read is the one checked.
    target = await checked_target(ctx, path)
    if not ctx.extra.get("bypassCwdCheck") and outside_project(ctx, path, target.real):
        await assert_external_directory(ctx, path, kind="directory" if target.is_dir else "file", real=target.real)
    await ctx.ask("read", [path, *target.spellings], ["*"], {}, target.respellings)

    walk_root = ctx.directory if _strictly_inside(ctx.directory, path) else None
    loaded_before = frozenset(ctx.state.loaded_instructions)
    denied = _denial_check(ctx)
    info = ctx.io_now(stat_or_none, target.real)
    if info is not None and stat.S_ISREG(info.st_mode) and info.st_size <= IO_NOW_BYTES:
        found = ctx.io_now(_load, target, offset, limit, walk_root, loaded_before, denied)
    else:
        found = await ctx.io(_load, target, offset, limit, walk_root, loaded_before, denied)

    if isinstance(found, _Missing):
        message = f"File not found: {path}"
        if found.suggestions:
            message += "\n\nDid you mean one of these?\n" + "\n".join(found.suggestions)
        raise ToolError(message)
    if isinstance(found, _Directory):
        return _directory_output(path, title, found.entries, offset, limit)
    if isinstance(found, _Media):
        kind = "PDF" if found.mime == "application/pdf" else "Image"
        message = f"{kind} read successfully"
        url = f"data:{found.mime};base64,{base64.b64encode(found.data).decode('ascii')}"
        # As upstream, instruction files near an image are claimed (listed in `loaded`) but not shown.
        loaded = [where for where, _ in found.instructions]
        ctx.state.loaded_instructions.update(loaded)
        return ToolOutput(title=title, output=message,
                          metadata={"preview": message, "truncated": False, "loaded": loaded},
                          attachments=[Attachment(mime=found.mime, url=url)])
    if isinstance(found, _Binary):
        raise ToolError(f"Cannot read binary file: {path}")

    if found.count < offset and not (found.count == 0 and offset == 1):
        raise ToolError(f"Offset {js_number(offset)} is out of range for this file ({found.count} lines)")
    ctx.file_times.read(path, time.time())
    loaded = [where for where, _ in found.instructions]
    ctx.state.loaded_instructions.update(loaded)
    return ToolOutput(title=title, output=_file_output(path, found, offset), metadata={
        "preview": "\n".join(found.lines[:PREVIEW_LINES]),
        "truncated": found.more or found.cut,
        "loaded": loaded,
    })


def _denial_check(ctx: ToolContext) -> Callable[[str], bool] | None:
    """Whether a `read` deny covers an instruction file (any of its names), for `_load`; None: no rule can."""
    rules = ctx.rules
    if rules is None or not rules.may_deny("read"):
        return None
    workspace = ctx.directory

    def denied(candidate: str) -> bool:
        names = path_names(candidate, workspace)
        return names is None or any(rules.action("read", name) == "deny" for name in names)

    return denied


def _strictly_inside(directory: str, path: str) -> bool:
    """Whether `path` lies strictly below `directory` (instruction files are looked up in between)."""
    rel = os.path.relpath(path, directory)
    return rel != "." and not rel.startswith("..")


def _whole(value: Any, name: str) -> int | None:
    """offset/limit arrive as (coerced) numbers; a fraction would give lines labels like "2.5: ", so refuse it."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ToolError(f"{name} must be a whole number, got {value}")


def _file_output(path: str, text: _Text, offset: int) -> str:
    numbered = "\n".join(f"{offset + i}: {line}" for i, line in enumerate(text.lines))
    last = offset + len(text.lines) - 1
    if text.cut:
        footer = f"(Output capped at 50 KB. Showing lines {offset}-{last}. Use offset={last + 1} to continue.)"
    elif text.more:
        footer = f"(Showing lines {offset}-{last} of {text.count}. Use offset={last + 1} to continue.)"
    else:
        footer = f"(End of file - total {text.count} lines)"
    output = f"<path>{path}</path>\n<type>file</type>\n<content>{numbered}\n\n{footer}\n</content>"
    if text.instructions:
        blocks = "\n\n".join(f"Instructions from: {where}\n{content}" for where, content in text.instructions)
        output += f"\n\n<system-reminder>\n{blocks}\n</system-reminder>"
    return output


def _directory_output(path: str, title: str, entries: list[str], offset: int, limit: int) -> ToolOutput:
    start = offset - 1
    shown = entries[start:start + limit]  # like JavaScript's slice, a negative limit counts from the end
    truncated = start + len(shown) < len(entries)
    if truncated:
        count = (f"(Showing {len(shown)} of {len(entries)} entries. "
                 f"Use 'offset' parameter to read beyond entry {offset + len(shown)})")
    else:
        count = f"({len(entries)} entries)"
    output = "\n".join([f"<path>{path}</path>", "<type>directory</type>", "<entries>", "\n".join(shown),
                        f"\n{count}", "</entries>"])
    return ToolOutput(title=title, output=output, metadata={
        "preview": "\n".join(shown[:PREVIEW_LINES]), "truncated": truncated, "loaded": [],
    })


# --- everything below runs in ctx.io or ctx.io_now (the tool user's filesystem identity) ---


def _load(target: Target, offset: int, limit: int, walk_root: str | None, already_loaded: frozenset[str],
          denied: Callable[[str], bool] | None) -> _Missing | _Directory | _Media | _Binary | _Text:
    path = target.path
    if target.identity is None:
        target.missing_or_raise()
        return _Missing(_suggestions(path))
    if target.is_dir:
        try:
            return _Directory(_list_directory(target))
        except (FileNotFoundError, NotADirectoryError):
            return _Missing(_suggestions(path))
    extension = os.path.splitext(path)[1].lower()
    if extension in BINARY_EXTENSIONS:
        return _Binary()
    instructions = _instructions(os.path.normpath(path), walk_root, already_loaded, denied) if walk_root else []
    mime = MEDIA_TYPES.get(extension)
    try:
        fd = open_checked(target, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return _Missing(_suggestions(path))
    with os.fdopen(fd, "rb") as fh:
        if mime is not None:
            return _Media(mime, fh.read(), instructions)
        size = os.fstat(fh.fileno()).st_size
        sample = fh.read(SAMPLE_SIZE)
        # Like upstream, a file that reports size 0 (e.g. under /proc) skips the content sniffing.
        if size > 0 and _looks_binary(sample):
            return _Binary()
        text = _read_text(fh, sample, offset, limit)
    text.instructions = instructions
    return text


def _suggestions(path: str) -> list[str]:
    # Node's dirname/basename (a trailing slash is ignored) and its normalising path.join.
    directory, base = node_dirname(path), os.path.basename(path.rstrip("/")).lower()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    similar = [name for name in names if base in name.lower() or name.lower() in base]
    return [os.path.normpath(os.path.join(directory, name)) for name in similar[:3]]


def _list_directory(target: Target) -> list[str]:
    """The checked directory's entries (opened without following links, its identity proven)."""
    fd = open_checked(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entries: list[str] = []
        with os.scandir(fd) as it:
            for entry in it:
                is_dir = entry.is_dir(follow_symlinks=False)
                if not is_dir and entry.is_symlink():
                    try:
                        is_dir = stat.S_ISDIR(os.stat(entry.name, dir_fd=fd).st_mode)
                    except OSError:
                        is_dir = False
                entries.append(entry.name + "/" if is_dir else entry.name)
    finally:
        os.close(fd)
    return sorted(entries, key=locale_key)


def _looks_binary(sample: bytes) -> bool:
    if not sample:
        return False
    if 0 in sample:
        return True
    control = sum(1 for byte in sample if byte < 9 or 13 < byte < 32)
    return control / len(sample) > 0.3


class _Splitter:
    """Splits decoded text as Node's readline does: `\n`, `\r\n` and a lone `\r` end a line, no empty last line.

    Text arrives in chunks, so a `\r\n` may straddle two. Lines are clipped to _KEEP_CHARS code points so a
    huge line never sits in memory; `count` only counts lines, for the part of the file past the page.
    """

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._kept = 0
        self._open = False  # a line has begun and not ended yet
        self._after_cr = False  # the previous chunk ended in "\r": a "\n" opening this one ends no new line

    def split(self, text: str) -> list[str]:
        position = self._start(text)
        lines: list[str] = []
        for match in _LINE_BREAK.finditer(text, position):
            self._add(text[position:match.start()])
            lines.append("".join(self._pieces))
            self._pieces, self._kept, self._open = [], 0, False
            position = match.end()
        if position < len(text):
            self._add(text[position:])
            self._open = True
        self._end(text)
        return lines

    def count(self, text: str) -> int:
        position = self._start(text)
        body = text[position:]
        breaks = body.count("\n") + body.count("\r") - body.count("\r\n")
        if breaks:
            self._pieces, self._kept, self._open = [], 0, False
        if body and body[-1] not in "\r\n":
            self._open = True
        self._end(text)
        return breaks

    def finish(self) -> str | None:
        """The last line when the text does not end with a line break."""
        return "".join(self._pieces) if self._open else None

    def _start(self, text: str) -> int:
        return 1 if self._after_cr and text.startswith("\n") else 0

    def _end(self, text: str) -> None:
        if text:
            self._after_cr = text.endswith("\r")

    def _add(self, piece: str) -> None:
        if self._kept < _KEEP_CHARS:
            piece = piece[:_KEEP_CHARS - self._kept]
            self._pieces.append(piece)
            self._kept += len(piece)


class _Page:
    """Collects the lines from `offset` on until `limit` lines or the byte cap, counting every line."""

    def __init__(self, offset: int, limit: int) -> None:
        self.start, self.limit = offset - 1, limit
        self.text = _Text(lines=[], count=0, cut=False, more=False)
        self.size = 0

    @property
    def full(self) -> bool:
        return len(self.text.lines) >= self.limit

    def skip(self, lines: int) -> None:
        """Lines past a full page: only counted (to report the total)."""
        self.text.count += lines
        self.text.more = self.text.more or lines > 0

    def add(self, raw: str) -> bool:
        """Takes one line; False once the byte cap is hit and reading should stop."""
        text = self.text
        text.count += 1
        if text.count <= self.start:
            return True
        if self.full:
            text.more = True
            return True
        line = raw
        if utf16_length(raw) > MAX_LINE_LENGTH:
            line = utf16_prefix(raw, MAX_LINE_LENGTH) + LINE_SUFFIX
        cost = len(line.encode("utf-8")) + (1 if text.lines else 0)
        if self.size + cost > MAX_BYTES:
            text.cut = text.more = True
            return False
        text.lines.append(line)
        self.size += cost
        return True


def _read_text(fh: IO[bytes], first: bytes, offset: int, limit: int) -> _Text:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    splitter = _Splitter()
    page = _Page(offset, limit)
    data = first
    while True:
        final = not data
        text = decoder.decode(data, final=final)
        if page.full:
            page.skip(splitter.count(text))
        elif not all(page.add(line) for line in splitter.split(text)):
            return page.text
        if final:
            break
        data = fh.read(CHUNK_SIZE)
    last = splitter.finish()
    if last is not None:
        page.add(last)
    return page.text


def _instructions(path: str, root: str, already_loaded: frozenset[str],
                  denied: Callable[[str], bool] | None) -> list[tuple[str, str]]:
    """Instruction files between the file's directory (included) and the project directory (excluded).

    One that a `read` deny covers by any of its names (a symlink `AGENTS.md -> ../.env`) is left out, and
    each is read as it was checked (safe_open), like the file itself.
    """
    found: list[tuple[str, str]] = []
    current = os.path.dirname(path)
    while _strictly_inside(root, current):
        candidate = next((os.path.join(current, name) for name in INSTRUCTION_FILES
                          if os.path.exists(os.path.join(current, name))), None)
        if candidate and candidate != path and candidate not in already_loaded and not (denied and denied(candidate)):
            try:
                content = read_bytes(inspect(candidate, None)).decode("utf-8", errors="replace")
            except (OSError, ToolError):
                content = ""
            if content:
                found.append((candidate, content))
        current = os.path.dirname(current)
    return found
