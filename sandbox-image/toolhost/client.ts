// The SDK client a project plugin receives as `input.client`. Upstream hands plugins the real
// `@opencode-ai/sdk` client bound to its in-process server; plugins log through it (often at init,
// without a try) and show toasts. The sandbox has no OpenCode server, so the same client is built
// over a local responder: logs go to the host's log, toasts are accepted, and every other route
// answers with an error result the way the SDK reports a failed request (`{ error }`, or a throw
// with `throwOnError`), instead of `client` being undefined and the plugin failing to load.
import { log } from "./channel.ts"

type ClientFactory = (config: Record<string, unknown>) => unknown

const ACCEPTED = new Set(["POST /log", "POST /tui/show-toast"])
let factory: Promise<ClientFactory> | undefined

function json(body: unknown, status: number): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } })
}

async function respond(request: Request): Promise<Response> {
  const route = `${request.method} ${new URL(request.url).pathname}`
  if (ACCEPTED.has(route)) {
    const body = await request.text()
    log(`plugin client ${route} ${body.slice(0, 2000)}`)
    return json(true, 200)
  }
  const message = `the OpenCode server API is not available to plugins in the sandbox (${route})`
  return json({ name: "UnknownError", data: { message } }, 501)
}

/** A client shaped like upstream's, answering locally; the SDK is imported on first use only. */
export async function pluginClient(directory: string): Promise<unknown> {
  factory ??= import("@opencode-ai/sdk").then((sdk) => sdk.createOpencodeClient as ClientFactory)
  const create = await factory
  return create({
    baseUrl: "http://localhost:4096", directory,
    fetch: (input: Request | string | URL, init?: RequestInit) =>
      respond(input instanceof Request ? input : new Request(input, init)),
  })
}
