// A plain-JS plugin that reports through the SDK client the moment it starts, with no guard around
// the call, and whose tool later asks the server for something the sandbox has no server for.
export const Logbook = async ({ client, directory }) => {
  await client.app.log({ body: { service: "logbook", level: "info", message: `opened in ${directory}` } })
  return {
    tool: {
      logbook_ask: {
        description: "Asks the OpenCode server about its sessions through the plugin's client",
        args: {},
        async execute() {
          const toast = await client.tui.showToast({ body: { message: "asking", variant: "info" } })
          const sessions = await client.session.list()
          return `toast=${toast.data} sessions=${sessions.data ?? "none"} error=${sessions.error?.data?.message}`
        },
      },
    },
  }
}
