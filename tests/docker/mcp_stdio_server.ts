// A stdio MCP server on the official TypeScript SDK, run by Bun inside the sandbox for
// tests/docker/test_mcp_sandbox.py. `slow` writes MARKER (env) when the client cancels it.
import { writeFileSync } from "node:fs"
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js"
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js"
import { z } from "zod"

const server = new McpServer({ name: "ts-test", version: "1.0.0" })

server.registerTool("echo", { description: "Echoes text", inputSchema: { text: z.string() } }, async ({ text }) => ({
  content: [{ type: "text", text }],
}))

server.registerTool("whoami", { description: "Who and where the server runs" }, async () => ({
  content: [{ type: "text", text: `${process.getuid?.()}|${process.cwd()}|${process.env.GREETING}` }],
}))

server.registerTool("picture", { description: "An image and a caption" }, async () => ({
  content: [
    { type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" },
    { type: "text", text: "caption" },
  ],
}))

server.registerTool(
  "slow",
  { description: "Sleeps", inputSchema: { seconds: z.number() } },
  async ({ seconds }, extra) => {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(resolve, seconds * 1000)
      extra.signal.addEventListener("abort", () => {
        clearTimeout(timer)
        if (process.env.MARKER) writeFileSync(process.env.MARKER, "cancelled")
        reject(new Error("cancelled"))
      })
    })
    return { content: [{ type: "text", text: "slept" }] }
  },
)

await server.connect(new StdioServerTransport())
