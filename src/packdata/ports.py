"""A TCP port on loopback that nothing listens on: for the servers and daemons the course starts."""

import socket


def free_port():
    """A TCP port free on 127.0.0.1 right now (another program may take it before it is used)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
