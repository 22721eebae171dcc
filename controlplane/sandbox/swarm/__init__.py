"""Sandboxes as one-replica Docker Swarm services, placed by Swarm's scheduler on any node.

provider: places, watches, adopts and removes sandboxes, and reports the ones it loses.
service:  a sandbox's task template and the fail-closed check of what the engine stored.
fleet:    the relay service of one control plane and its per-node clients.
relay:    the relay program itself (stdlib only), shipped to every node as a Swarm config.
channel:  the control plane's side of the agent channel: relay PKI, relay client, local forwarders.
egress_link: a session's way out, from the relay's egress.sock on the node back to its proxy here.
images:   template images built on the manager, copied to the other nodes' engines, placed where they are.
adoption: the provider's start: which services it adopts into sessions and template pools, which it removes.
"""
