// Uses the runtime APIs real tools reach for: Bun.$, Bun.file/Bun.write, node:fs, node:path,
// node:child_process, fetch (to a server it starts on loopback) and environment variables.
import { tool } from "@opencode-ai/plugin"
import { execFile, execSync } from "node:child_process"
import { existsSync, readFileSync, writeFileSync } from "node:fs"
import path from "node:path"

const use = tool.schema.enum(["shell", "shell-fail", "files", "node-fs", "child", "child-abort", "fetch", "env"])

export default tool({
  description: "Runs one runtime feature",
  args: { use },
  async execute(args, context) {
    switch (args.use) {
      case "shell": {
        const text = await Bun.$`echo "from bun" ${"a b"} | tr a-z A-Z`.cwd(context.directory).text()
        const quiet = await Bun.$`pwd`.quiet()
        return `${text.trim()}|${quiet.stdout.toString().trim()}|${quiet.exitCode}`
      }
      case "shell-fail": {
        const result = await Bun.$`sh -c "echo oops >&2; exit 3"`.nothrow().quiet()
        try {
          await Bun.$`sh -c "exit 4"`.quiet()
          return "no throw"
        } catch (error) {
          return `nothrow=${result.exitCode}:${result.stderr.toString().trim()} throw=${(error as { exitCode: number }).exitCode}`
        }
      }
      case "files": {
        const target = path.join(context.directory, "runtime-out.txt")
        await Bun.write(target, "written by Bun.write\n")
        const file = Bun.file(target)
        return `${await file.exists()}|${file.size}|${(await file.text()).trim()}`
      }
      case "node-fs": {
        const target = path.resolve(context.directory, "sub", "..", "node-fs-out.json")
        writeFileSync(target, JSON.stringify({ at: path.relative(context.directory, target) }))
        return `${existsSync(target)}|${readFileSync(target, "utf8")}`
      }
      case "child": {
        const sync = execSync("echo sync; id -u", { cwd: context.directory, encoding: "utf8" })
        const asynchronous = await new Promise<string>((resolve, reject) =>
          execFile("sh", ["-c", "echo async"], (error, stdout) => (error ? reject(error) : resolve(stdout))))
        return `${sync.trim().replace("\n", ",")}|${asynchronous.trim()}`
      }
      case "child-abort": {
        context.metadata({ title: "sleeping" })
        return await new Promise<string>((resolve) =>
          execFile("sleep", ["30"], { signal: context.abort }, (error) => resolve(`ended: ${error?.name}`)))
      }
      case "fetch": {
        const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: (request) => Response.json({ path: new URL(request.url).pathname }) })
        try {
          const response = await fetch(`http://127.0.0.1:${server.port}/probe?x=1`, { signal: context.abort })
          return `${response.status} ${JSON.stringify(await response.json())}`
        } finally {
          server.stop(true)
        }
      }
      case "env": {
        const home = process.env.HOME ?? ""
        return JSON.stringify({ home: home.length > 0, path: (process.env.PATH ?? "").includes("/usr/bin"), missing: process.env.PATTERNS_NOT_SET ?? "fallback" })
      }
    }
  },
})
