// Makes the host untouchable by the session's tool processes; imported first by host.ts.
//
// The agent starts the host with real uid = the host's own uid (say 1001) and effective uid = the tool
// user (1000), so files the tools create still belong to the tool user. execve copied the effective uid
// into the saved uid, and the kernel lets a process signal another whose real OR saved uid equals its own
// real or effective uid: until the saved uid is the host uid again, any tool process could SIGKILL or
// SIGSTOP the host. ptrace and /proc/PID/mem already fail (the exec changed identity, so the host is not
// dumpable and its real uid is not the caller's); the prctl below keeps it so explicitly.
//
// Children must not inherit the host's real uid: a child with it could signal the host, and a shell
// started with real != effective uid drops to the real uid (bash and dash do), so its files would belong
// to the host uid and /workspace would refuse them. Every child started through Bun.spawn / spawnSync
// (node:child_process goes through them too) is therefore started via `setpriv --ruid=<tool uid>`, which
// needs no privilege (a process may set its real uid to its effective one).
//
// On gVisor, whose execve resets the effective uid to the real one, the agent starts the host as root with
// CAP_SETUID alone and the two uids in AGENT_SERVER_UIDS ("S:T"): the first step below takes them with
// setresuid(S, T, S), which drops the capability and makes the host non-dumpable; from there on it is the
// same host as on runc (sandbox_agent/server_identity.py). For the same reason `setpriv --ruid` cannot start
// a child there (after its exec setpriv is S, S, S): a child must already have the tool user's real uid when
// it is forked. So the host lends its real uid to the tool user for the spawn call alone (`lent`): a tool
// process could signal the host during that call (for a spawnSync, the child's whole run), never ptrace it
// or read its memory (its saved uid stays its own and it stays non-dumpable) — docs/security.md, gap 8.
import { dlopen, FFIType } from "bun:ffi"
import { track } from "./children.ts"

const PR_SET_DUMPABLE = 4
const SETPRIV = "/usr/bin/setpriv"

type Ids = { ruid: number; euid: number; rootStarted: boolean }

const SERVER_UIDS_ENV = "AGENT_SERVER_UIDS"

/** Whether the host was started as root and took its uids itself (gVisor). */
function takeServerUids(ruid: number, setresuid: (r: number, e: number, s: number) => number): boolean {
  const given = process.env[SERVER_UIDS_ENV]
  delete process.env[SERVER_UIDS_ENV] // not for the host's children
  // Started with its uids already (runc), or a test run of the agent without a tool user (as root or not).
  // A root host the agent meant to separate but that got no uids stays root: verify_server refuses it.
  if (ruid !== 0 || given === undefined) return false
  const match = /^(\d+):(\d+)$/.exec(given)
  if (match === null) throw new Error(`${SERVER_UIDS_ENV} is not "server:tool"`)
  const [server, tool] = [Number(match[1]), Number(match[2])]
  if (server === 0 || tool === 0) throw new Error(`${SERVER_UIDS_ENV} names root`)
  // glibc applies it to every thread of the process; the agent checks each task afterwards.
  if (setresuid(server, tool, server) !== 0) throw new Error("setresuid to the server uids failed")
  return true
}

function harden(): Ids | undefined {
  const libc = dlopen("libc.so.6", {
    getuid: { args: [], returns: FFIType.u32 },
    geteuid: { args: [], returns: FFIType.u32 },
    setresuid: { args: [FFIType.u32, FFIType.u32, FFIType.u32], returns: FFIType.i32 },
    prctl: { args: [FFIType.i32, FFIType.u64, FFIType.u64, FFIType.u64, FFIType.u64], returns: FFIType.i32 },
  })
  try {
    const rootStarted = takeServerUids(libc.symbols.getuid(), libc.symbols.setresuid)
    const ruid = libc.symbols.getuid()
    const euid = libc.symbols.geteuid()
    if (ruid === euid) return undefined // an unprivileged test run: nothing to separate from
    const keep = 0xffffffff // (uid_t)-1: leave that id as it is
    // glibc applies setresuid to every thread of the process; the agent checks each task afterwards.
    if (libc.symbols.setresuid(keep, keep, ruid) !== 0) throw new Error("setresuid failed")
    if (libc.symbols.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) !== 0) throw new Error("prctl(PR_SET_DUMPABLE) failed")
    return { ruid, euid, rootStarted }
  } finally {
    libc.close()
  }
}

type SpawnOptions = { cmd?: string[]; env?: Record<string, string | undefined>; cwd?: string }

/** argv through setpriv, when the program exists (a missing one keeps Bun's own ENOENT error). */
function dropped(cmd: string[], options: SpawnOptions | undefined, toolUid: number): string[] {
  const [program, ...rest] = cmd
  if (program === undefined) return cmd
  const path = options?.env?.PATH ?? process.env.PATH ?? ""
  const found = Bun.which(program, { PATH: path, cwd: options?.cwd ?? process.cwd() })
  if (found === null) return cmd
  return [SETPRIV, `--ruid=${toolUid}`, "--", program, ...rest] // setpriv looks it up as execvp would
}

/** `spawn` run with the host's real uid lent to the tool user, so the child is the tool user's after its exec
 * on a kernel whose exec sets the effective uid to the real one (gVisor). glibc applies each change to every
 * thread; the saved uid stays the host's, which is what lets it take its real uid back. */
function lent(ids: Ids): (spawn: () => unknown) => unknown {
  const libc = dlopen("libc.so.6", {
    setresuid: { args: [FFIType.u32, FFIType.u32, FFIType.u32], returns: FFIType.i32 },
    prctl: { args: [FFIType.i32, FFIType.u64, FFIType.u64, FFIType.u64, FFIType.u64], returns: FFIType.i32 },
  })
  const keep = 0xffffffff
  return (spawn) => {
    if (libc.symbols.setresuid(ids.euid, keep, keep) !== 0) throw new Error("setresuid (lend the real uid) failed")
    try {
      return spawn()
    } finally {
      // A host left with the tool user's real uid could be signalled by any tool process: it must not go on.
      if (libc.symbols.setresuid(ids.ruid, keep, keep) !== 0 || libc.symbols.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) !== 0) {
        process.exit(70)
      }
    }
  }
}

/** Bun.spawn / spawnSync: children recorded for their call (children.ts), and started as the tool user
 * when the host runs under its own uid (`ids`): through setpriv, or with its real uid lent (`lent`). */
function patchSpawn(ids: Ids | undefined): void {
  const viaSetpriv = ids !== undefined && !ids.rootStarted
  const around = ids !== undefined && ids.rootStarted ? lent(ids) : (spawn: () => unknown) => spawn()
  const rewrite = (cmd: string[], options: SpawnOptions | undefined) =>
    viaSetpriv ? dropped(cmd, options, ids!.euid) : cmd
  for (const name of ["spawn", "spawnSync"] as const) {
    const original = Bun[name] as (...args: unknown[]) => unknown
    const start = (first: unknown, second?: unknown) => around(() => {
      if (Array.isArray(first)) return original(rewrite(first as string[], second as SpawnOptions | undefined), second)
      if (typeof first === "object" && first !== null && Array.isArray((first as SpawnOptions).cmd)) {
        const options = first as SpawnOptions
        return original({ ...options, cmd: rewrite(options.cmd!, options) }, second)
      }
      return original(first, second)
    })
    const wrapped = name === "spawnSync" ? start : (first: unknown, second?: unknown) => {
      const child = start(first, second) as { pid: number; exited: Promise<unknown> }
      track(child)
      return child
    }
    Object.defineProperty(Bun, name, { value: wrapped, writable: false, configurable: false })
  }
}

const ids = harden()
patchSpawn(ids)
if (ids !== undefined) {
  // Code here is the tool user for every purpose but signals and ptrace: it says so, as it did before.
  const toolUid = ids.euid
  process.getuid = () => toolUid
}

// The Bun tool host starts in the image's toolhost directory (Bun resolved host.ts through the cwd's tsconfig
// `paths`, which a project's could point elsewhere: sandbox_agent/custom/host.py) and takes the project directory
// as its cwd here, before any tool loads: tools see it as `process.cwd()`, as upstream.
const hostCwd = process.env.OCSB_HOST_CWD
delete process.env.OCSB_HOST_CWD // not for the host's children
if (hostCwd) process.chdir(hostCwd)

export const hardened = ids !== undefined
