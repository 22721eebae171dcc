export default function tally(items) {
  return `${items.length} item${items.length === 1 ? "" : "s"}`
}
