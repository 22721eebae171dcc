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
import ctypes.util
import errno
import os
import platform
import struct

from sandbox_agent.errors import AgentError

_X86_64 = 0xC000003E
_AARCH64 = 0xC00000B7
_X32_BIT = 0x40000000
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210,
        "io_pgetevents": 333, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "userfaultfd": 323,
    },
    "aarch64": {
        "io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "io_pgetevents": 292,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282,
    },
}
_ARCH = {"x86_64": _X86_64, "aarch64": _AARCH64}

# Classic BPF, as seccomp runs it over `struct seccomp_data` (nr at offset 0, arch at 4).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class SyscallFilterError(AgentError):
    """The filter the control plane asked for is not in force."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(names: list[str], machine: str) -> bytes:
    """The filter for `machine` (platform.machine()) denying `names`; SyscallFilterError for what it cannot name."""
    numbers = _NUMBERS.get(machine)
    if numbers is None:
        raise SyscallFilterError(f"no syscall table for {machine}: the filter cannot be built")
    unknown = [n for n in names if n not in numbers]
    if unknown:
        raise SyscallFilterError(f"unknown system calls to deny: {', '.join(unknown)}")
    denied = sorted({numbers[n] for n in names})
    code = [_insn(_LD_W_ABS, 0, 0, 4), _insn(_JEQ_K, 1, 0, _ARCH[machine]), _insn(_RET_K, 0, 0, _RET_EPERM),
            _insn(_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        code += [_insn(_JGE_K, 0, 1, _X32_BIT), _insn(_RET_K, 0, 0, _RET_EPERM)]
    for i, number in enumerate(denied):  # a match jumps over the rest and the ALLOW, to the EPERM
        code.append(_insn(_JEQ_K, len(denied) - i, 0, number))
    code += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_EPERM)]
    return b"".join(code)


def install(names: list[str]) -> None:
    """Installs the filter on this (still single-threaded) process, then checks that io_setup is refused."""
    if not names:
        return
    machine = platform.machine()
    code = program(names, machine)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
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
