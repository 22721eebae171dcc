// Prints the golden data: every schema's z.toJSONSchema and, for each case of cases.json,
// String(zodError) or the parsed data. Usage: bun oracle.mjs cases.json > golden.json
import { readFileSync } from "node:fs"
import { z } from "zod"
import { TOOLS } from "./schemas.mjs"

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"))
const schemas = {}
for (const [id, schema] of Object.entries(TOOLS)) schemas[id] = z.toJSONSchema(schema)
const results = cases.map(({ tool, args }) => {
  const parsed = TOOLS[tool].safeParse(args)
  return parsed.success ? { tool, args, data: parsed.data } : { tool, args, error: String(parsed.error) }
})
process.stdout.write(JSON.stringify({ schemas, cases: results }, null, 2) + "\n")
