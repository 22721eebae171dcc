// The protocol channel: newline-delimited JSON on stdin (requests) and on the real stdout (messages).
// Tool code prints freely, so at start the real stdout is moved to a private descriptor and fd 1 is
// pointed at stderr; everything tool code writes to "stdout" (console.log, process.stdout, Bun.stdout,
// child processes) then lands in the driver's log instead of corrupting the protocol.
import { dlopen, FFIType } from "bun:ffi"
import { writeSync } from "node:fs"

function moveStdoutAside(): number {
  try {
    const libc = dlopen("libc.so.6", {
      dup: { args: [FFIType.i32], returns: FFIType.i32 },
      dup2: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
    })
    const channel = libc.symbols.dup(1)
    if (channel < 0 || libc.symbols.dup2(2, 1) < 0) throw new Error("dup/dup2 failed")
    libc.close()
    return channel
  } catch (error) {
    // Without FFI only the JavaScript writers can be rerouted; native writes to fd 1 would still leak.
    const toStderr = process.stderr.write.bind(process.stderr)
    process.stdout.write = toStderr as typeof process.stdout.write
    for (const name of ["log", "info", "debug", "trace", "dir", "table"] as const) {
      ;(console as unknown as Record<string, unknown>)[name] = console.error
    }
    process.stderr.write(`toolhost: stdout kept by JavaScript redirection only (${error})\n`)
    return 1
  }
}

const channelFd = moveStdoutAside()
const encoder = new TextEncoder()
const pending: Uint8Array[] = []
let flushing = false

/** Queues one protocol message; throws when it cannot be serialised (circular data, BigInt). */
export function send(message: Record<string, unknown>): void {
  pending.push(encoder.encode(JSON.stringify(message) + "\n"))
  if (!flushing) void flush()
}

async function flush(): Promise<void> {
  flushing = true
  try {
    while (pending.length > 0) {
      const chunk = pending[0]!
      let offset = 0
      while (offset < chunk.length) {
        try {
          offset += writeSync(channelFd, chunk, offset)
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== "EAGAIN") throw error
          await Bun.sleep(1) // a non-blocking pipe is full: let the driver catch up
        }
      }
      pending.shift()
    }
  } finally {
    flushing = false
  }
}

/** The request lines from stdin, until the driver closes it. */
export async function* requestLines(): AsyncGenerator<string> {
  const decoder = new TextDecoder()
  let buffered = ""
  for await (const chunk of Bun.stdin.stream()) {
    buffered += decoder.decode(chunk, { stream: true })
    let end: number
    while ((end = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, end)
      buffered = buffered.slice(end + 1)
      if (line.trim() !== "") yield line
    }
  }
  if (buffered.trim() !== "") yield buffered
}

export function log(text: string): void {
  process.stderr.write(`toolhost: ${text}\n`)
}
