"""The platform's own seccomp filter, stacked on the engine's default profile before any tool runs.

The control plane names the calls to deny (AGENT_SYSCALL_DENY: io_setup, io_uring_setup, ...: calls that
reach host-wide kernel tables, see controlplane/sandbox/confinement.py). The agent installs a filter that
answers them EPERM for itself and every process it starts; filters are inherited and cannot be removed.
The filter also refuses every call made through another ABI than the machine's own (32-bit `int 0x80`
on x86_64, x32), whose call numbers differ and would otherwise slip past the list. Nothing in the image
is a 32-bit program.

A filter that cannot be installed, or a denied call that still succeeds afterwards, stops the agent:
the sandbox never becomes ready, as with any other hardening option that did not apply.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from sandbox_agent.errors import AgentError

_X86_64 = 0xC000003E
_AARCH64 = 0xC00000B7
_X32_BIT = 0x40000000
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210,
        "io_pgetevents": 333, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "userfaultfd": 323, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "clone": 56, "clone3": 435,
    },
    "aarch64": {
        "io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "io_pgetevents": 292,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282,
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "clone": 220,
        "clone3": 435,
    },
}
CLONE_NAMESPACES = "clone:namespaces"
"""Not a whole call: `clone` asked for new namespaces (its flags, the first argument). Threads and forks pass."""
NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: the mask Docker's default profile checks."""
_ENOSYS_CALLS = {"clone3"}
"""Answered ENOSYS, not EPERM: clone3 passes its flags in memory a filter cannot read, and on ENOSYS (only)
glibc falls back to `clone`, whose flags are checked. Docker's default profile answers it the same way."""
_ARCH = {"x86_64": _X86_64, "aarch64": _AARCH64}

# Classic BPF, as seccomp runs it over `struct seccomp_data` (nr at offset 0, arch at 4).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_ARG0_LOW = 16
"""Offset of the low 32 bits of the first argument in `struct seccomp_data` (little-endian machines)."""
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_RET_ENOSYS = 0x00050000 | errno.ENOSYS
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class SyscallFilterError(AgentError):
    """The filter the control plane asked for is not in force."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


_Op = tuple[int | str, str, str, int]


def program(names: list[str], machine: str) -> bytes:
    """The filter for `machine` (platform.machine()) denying `names`; SyscallFilterError for what it cannot name."""
    numbers = _NUMBERS.get(machine)
    if numbers is None:
        raise SyscallFilterError(f"no syscall table for {machine}: the filter cannot be built")
    unknown = [n for n in names if n not in numbers and n != CLONE_NAMESPACES]
    if unknown:
        raise SyscallFilterError(f"unknown system calls to deny: {', '.join(unknown)}")
    denied = sorted({numbers[n] for n in names if n in numbers and n not in _ENOSYS_CALLS})
    missing = sorted({numbers[n] for n in names if n in _ENOSYS_CALLS})
    # (code, jump-if-true label, jump-if-false label, k), or ("label", name, "", 0) naming the next instruction.
    code: list[_Op] = [(_LD_W_ABS, "", "", 4), (_JEQ_K, "nr", "eperm", _ARCH[machine]), ("label", "nr", "", 0),
                       (_LD_W_ABS, "", "", 0)]
    if machine == "x86_64":
        code.append((_JGE_K, "eperm", "", _X32_BIT))
    code += [(_JEQ_K, "eperm", "", number) for number in denied]
    code += [(_JEQ_K, "enosys", "", number) for number in missing]
    if CLONE_NAMESPACES in names:
        code.append((_JEQ_K, "clone", "", numbers["clone"]))
    # Classic BPF jumps forward only: the clone check comes before the shared answers it jumps to.
    code += [(_RET_K, "", "", _RET_ALLOW),
             ("label", "clone", "", 0), (_LD_W_ABS, "", "", _ARG0_LOW), (_JSET_K, "eperm", "", NAMESPACE_FLAGS),
             (_RET_K, "", "", _RET_ALLOW),
             ("label", "eperm", "", 0), (_RET_K, "", "", _RET_EPERM),
             ("label", "enosys", "", 0), (_RET_K, "", "", _RET_ENOSYS)]
    return _assemble(code)


def _assemble(code: list[_Op]) -> bytes:
    labels: dict[str, int] = {}
    real: list[tuple[int, str, str, int]] = []
    for op, first, second, k in code:
        if op == "label":
            labels[first] = len(real)
        else:
            real.append((int(op), first, second, k))
    out = []
    for index, (op, jt, jf, k) in enumerate(real):
        def offset(label: str, here: int = index) -> int:
            jump = labels[label] - here - 1 if label else 0
            if not 0 <= jump <= 255:
                raise SyscallFilterError(f"the filter cannot jump to {label} from instruction {here}")
            return jump
        out.append(_insn(op, offset(jt), offset(jf), k))
    return b"".join(out)


def install(names: list[str]) -> None:
    """Installs the filter on this (still single-threaded) process, then checks that io_setup is refused."""
    if not names:
        return
    machine = os.uname().machine  # platform.machine()'s own source, without importing platform (0.1 MiB)
    code = program(names, machine)
    # The process's own symbols, libc's among them: ctypes.util.find_library would import shutil, tempfile and
    # subprocess (0.2 MiB of every idle agent) and run `ldconfig -p` to find the same library.
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    # Without CAP_SYS_ADMIN a filter needs no_new_privs; Docker sets it, a Swarm task does not.
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SyscallFilterError(f"prctl(NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SyscallFilterError(f"the syscall filter was refused: {os.strerror(ctypes.get_errno())}")
    if "io_setup" in names:
        context = ctypes.c_ulong(0)
        if libc.syscall(_NUMBERS[machine]["io_setup"], 1, ctypes.byref(context)) == 0:
            raise SyscallFilterError("io_setup still succeeds under the syscall filter")


def from_env(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]
