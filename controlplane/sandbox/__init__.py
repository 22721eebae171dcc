"""Sandboxes: the Docker, Swarm and in-process providers of core.seam's interface, the layout they share,
and the agent channel."""
