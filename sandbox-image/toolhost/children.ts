// Which call started which child process: a call that ignores abort is abandoned rather than taking the
// host down with it, so the host itself must end the children such a call left running (before, killing
// the host's process group ended them). Bun.spawn (and node:child_process, which goes through it) records
// each child in the store of the call whose async context started it.
import { AsyncLocalStorage } from "node:async_hooks"

const current = new AsyncLocalStorage<Set<number>>()

/** Runs `body` (a call's execute) so that the children it starts are recorded in `children`. */
export function recordingChildren<T>(children: Set<number>, body: () => T): T {
  return current.run(children, body)
}

/** Records a child started now; it is forgotten once it exited. */
export function track(child: { pid: number; exited: Promise<unknown> }): void {
  const children = current.getStore()
  if (children === undefined) return
  children.add(child.pid)
  void child.exited.finally(() => children.delete(child.pid))
}

/** SIGKILL to every recorded child still running. */
export function killAll(children: Set<number>): void {
  for (const pid of children) {
    try {
      process.kill(pid, "SIGKILL")
    } catch {
      // it ended meanwhile
    }
  }
  children.clear()
}
