"""`make bench`'s report of the core rows: p50/p99 per row, speedups over the baselines, and PASS/FAIL against
the design's targets."""

from __future__ import annotations

import math

from tests.bench.bench_common import (
    ABORT_TARGET_MS,
    EXEC_MIN_SPEEDUP,
    EXEC_TARGET_MS,
    PERMISSION_OVERHEAD_TARGET_MS,
    TOOL_MIN_SPEEDUP,
    TOOL_TARGET_MS,
    WARM_TARGET_MS,
    Row,
)

# -- report ----------------------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def speedup(baseline: Row | None, row: Row | None) -> str:
    if baseline is None or row is None or not baseline.samples_ms or not row.samples_ms:
        return "n/a"
    ratio = baseline.p50 / row.p50
    return f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def print_report(rows: dict[str, Row], notes: list[str]) -> None:
    print()
    header = f"{'measurement':<38} {'n':>5} {'p50 ms':>10} {'p99 ms':>10} {'min ms':>10} {'max ms':>10}"
    print(header)
    print("-" * len(header))
    for row in rows.values():
        s = row.samples_ms
        lo = min(s) if s else math.nan
        hi = max(s) if s else math.nan
        cells = " ".join(f"{fmt_ms(v):>10}" for v in (row.p50, row.p99, lo, hi))
        print(f"{row.name:<38} {len(s):>5} {cells}")

    warm, cold = rows.get("warm"), rows.get("cold")
    exec_row, docker_run, docker_exec = rows.get("exec"), rows.get("docker_run"), rows.get("docker_exec")
    dockerpy_exec = rows.get("dockerpy_exec")
    print()
    print("ratios (p50 of baseline / p50 of measurement):")
    print(f"  warm create  vs docker run --rm     : {speedup(docker_run, warm)}")
    print(f"  cold create  vs docker run --rm     : {speedup(docker_run, cold)}")
    print(f"  exec         vs docker exec (CLI)   : {speedup(docker_exec, exec_row)}")
    print(f"  exec         vs docker-py exec_run  : {speedup(dockerpy_exec, exec_row)}")
    agent_exec = rows.get("agent_exec")
    if exec_row is not None and agent_exec is not None and exec_row.samples_ms and agent_exec.samples_ms:
        hop = exec_row.p50 - agent_exec.p50
        print(f"  exec p50 in the public API hop (exec - diag agent Exec, measured apart): ~{hop:.2f} ms")
    tool_read, tool_bash = rows.get("tool_read"), rows.get("tool_bash")
    docker_cat, docker_echo, local_read = rows.get("docker_cat"), rows.get("docker_echo"), rows.get("local_read")
    print(f"  tool read    vs docker exec cat     : {speedup(docker_cat, tool_read)}")
    print(f"  tool read    vs python open().read(): {speedup(local_read, tool_read)}")
    print(f"  tool bash    vs docker exec echo    : {speedup(docker_echo, tool_bash)}")

    print()
    print("targets:")
    if warm is not None and warm.samples_ms:
        ok = warm.p50 <= WARM_TARGET_MS
        print(f"  {'PASS' if ok else 'FAIL'}  warm acquire p50 {warm.p50:.2f} ms <= {WARM_TARGET_MS:g} ms")
    else:
        print("  FAIL  warm acquire: not measured")
    if exec_row is not None and exec_row.samples_ms and docker_exec is not None and docker_exec.samples_ms:
        ratio = docker_exec.p50 / exec_row.p50
        ok = exec_row.p50 <= EXEC_TARGET_MS and ratio >= EXEC_MIN_SPEEDUP
        print(
            f"  {'PASS' if ok else 'FAIL'}  exec round trip p50 {exec_row.p50:.2f} ms <= {EXEC_TARGET_MS:g} ms "
            f"and {ratio:.1f}x >= {EXEC_MIN_SPEEDUP:g}x faster than docker exec"
        )
    else:
        print("  FAIL  exec round trip: not measured")
    print_tool_target("tool read (small file)", tool_read, docker_cat, "docker exec cat")
    print_tool_target("tool bash echo", tool_bash, docker_echo, "docker exec echo")
    ruled, gate = rows.get("tool_bash_rules"), rows.get("permission_gate")
    if ruled is not None and ruled.samples_ms and tool_bash is not None and tool_bash.samples_ms:
        print(f"  info  80-rule project vs default rules, bash echo p50: {ruled.p50 - tool_bash.p50:+.2f} ms "
              "(two sessions, noisy)")
    if gate is not None and gate.samples_ms:
        ok = gate.p99 <= PERMISSION_OVERHEAD_TARGET_MS
        print(f"  {'PASS' if ok else 'FAIL'}  permission overhead of an allowed call p99 {gate.p99:.3f} ms "
              f"<= {PERMISSION_OVERHEAD_TARGET_MS:g} ms")
    else:
        print("  FAIL  permission overhead: not measured")
    abort_gone = rows.get("abort_gone")
    if abort_gone is not None and abort_gone.samples_ms:
        ok = abort_gone.p50 <= ABORT_TARGET_MS
        print(f"  {'PASS' if ok else 'FAIL'}  abort -> all processes gone p50 {abort_gone.p50:.2f} ms "
              f"<= {ABORT_TARGET_MS:g} ms")
    else:
        print("  FAIL  abort -> all processes gone: not measured")
    if notes:
        print()
        print("notes:")
        for note in notes:
            print(f"  - {note}")


def print_tool_target(label: str, row: Row | None, baseline: Row | None, baseline_label: str) -> None:
    if row is None or not row.samples_ms or baseline is None or not baseline.samples_ms:
        print(f"  FAIL  {label}: not measured")
        return
    ratio = baseline.p50 / row.p50
    ok = row.p50 <= TOOL_TARGET_MS and ratio >= TOOL_MIN_SPEEDUP
    print(
        f"  {'PASS' if ok else 'FAIL'}  {label} p50 {row.p50:.2f} ms <= {TOOL_TARGET_MS:g} ms "
        f"and {ratio:.1f}x >= {TOOL_MIN_SPEEDUP:g}x faster than {baseline_label}"
    )
