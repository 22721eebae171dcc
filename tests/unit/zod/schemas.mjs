// The zod schemas the golden files are produced from: upstream v1.2.27's tool parameters, written
// from the reference (Instance.directory is the sandbox workspace), plus `feature_*` schemas that
// exercise what controlplane.core.schema maps (defaults, enums, bounds, coercion, nesting, ...).
import { z } from "zod"

const DIRECTORY = "/workspace"

const editFields = {
  filePath: z.string().describe("The absolute path to the file to modify"),
  oldString: z.string().describe("The text to replace"),
  newString: z.string().describe("The text to replace it with (must be different from oldString)"),
  replaceAll: z.boolean().optional().describe("Replace all occurrences of oldString (default false)"),
}

export const TOOLS = {
  invalid: z.object({
    tool: z.string(),
    error: z.string(),
  }),
  bash: z.object({
    command: z.string().describe("The command to execute"),
    timeout: z.number().describe("Optional timeout in milliseconds").optional(),
    workdir: z
      .string()
      .describe(`The working directory to run the command in. Defaults to ${DIRECTORY}. Use this instead of 'cd' commands.`)
      .optional(),
    description: z
      .string()
      .describe(
        "Clear, concise description of what this command does in 5-10 words. Examples:\nInput: ls\nOutput: Lists files in current directory\n\nInput: git status\nOutput: Shows working tree status\n\nInput: npm install\nOutput: Installs package dependencies\n\nInput: mkdir foo\nOutput: Creates directory 'foo'",
      ),
  }),
  read: z.object({
    filePath: z.string().describe("The absolute path to the file or directory to read"),
    offset: z.coerce.number().describe("The line number to start reading from (1-indexed)").optional(),
    limit: z.coerce.number().describe("The maximum number of lines to read (defaults to 2000)").optional(),
  }),
  write: z.object({
    content: z.string().describe("The content to write to the file"),
    filePath: z.string().describe("The absolute path to the file to write (must be absolute, not relative)"),
  }),
  edit: z.object(editFields),
  multiedit: z.object({
    filePath: z.string().describe("The absolute path to the file to modify"),
    edits: z.array(z.object(editFields)).describe("Array of edit operations to perform sequentially on the file"),
  }),
  apply_patch: z.object({
    patchText: z.string().describe("The full patch text that describes all changes to be made"),
  }),
  glob: z.object({
    pattern: z.string().describe("The glob pattern to match files against"),
    path: z
      .string()
      .optional()
      .describe(
        `The directory to search in. If not specified, the current working directory will be used. IMPORTANT: Omit this field to use the default directory. DO NOT enter "undefined" or "null" - simply omit it for the default behavior. Must be a valid directory path if provided.`,
      ),
  }),
  grep: z.object({
    pattern: z.string().describe("The regex pattern to search for in file contents"),
    path: z.string().optional().describe("The directory to search in. Defaults to the current working directory."),
    include: z.string().optional().describe('File pattern to include in the search (e.g. "*.js", "*.{ts,tsx}")'),
  }),
  list: z.object({
    path: z.string().describe("The absolute path to the directory to list (must be absolute, not relative)").optional(),
    ignore: z.array(z.string()).describe("List of glob patterns to ignore").optional(),
  }),

  feature_values: z.object({
    mode: z.enum(["text", "markdown", "html"]).default("markdown").describe("The format"),
    kind: z.literal("only"),
    code: z.literal([1, 2, "x"]).optional(),
    flag: z.boolean().default(false).describe("A flag"),
    order: z.array(z.string()).default(["a"]),
  }),
  feature_numbers: z.object({
    level: z.number().int().min(1).max(5).describe("Level"),
    ratio: z.number().gt(0).lt(1).optional(),
    page: z.coerce.number().int().min(1).optional(),
    count: z.number().int().optional(),
    positive: z.number().int().gt(0).optional(),
    half: z.number().min(0.5).max(1e21).optional(),
  }),
  feature_nesting: z.object({
    name: z.string().min(2).max(8),
    items: z
      .array(
        z.strictObject({
          name: z.string().min(1).describe("Item name"),
          count: z.number().int().min(0).optional(),
        }),
      )
      .min(1)
      .max(3)
      .describe("Items"),
    tags: z.array(z.string().min(1).describe("A tag")).optional(),
    meta: z.looseObject({ key: z.string() }).optional().describe("Loose metadata"),
    labels: z.record(z.string(), z.number()).optional(),
  }),
  feature_unions: z.object({
    value: z.union([z.string(), z.number()]).optional(),
    note: z.string().nullable(),
    anything: z.any().optional(),
    short: z.union([z.string().min(3), z.boolean()]).optional(),
  }),
}
