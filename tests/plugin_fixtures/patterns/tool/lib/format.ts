// A helper module next to the tools (not a tool itself: subdirectories are not scanned).
export function framed(text: string): string {
  return `[${text}]`
}
