// A definition written without `args` (upstream takes the missing shape as an empty one) whose
// execute reaches a helper and a field of its own definition through `this`.
export default {
  description: "Says what is on the shelf",
  label: "shelf",
  items() {
    return ["jar", "tin"]
  },
  async execute(args) {
    return `${this.label}: ${this.items().join(",")} (given ${JSON.stringify(args)})`
  },
}
