"""A session's network: the vetting HTTP proxy the control plane owns for a session given an allowlist.

The sandbox keeps `--network none`; its tools reach the proxy through a forwarder on the sandbox's own loopback
and a Unix socket in the session's socket dir. The proxy decides, resolves, connects to the address it vetted,
meters bytes and adds brokered credentials, so a secret never enters the sandbox.
"""
