"""A server in a process of its own: started with a command, it answers its address on standard
output; a line on its standard input stops it.

    child = ChildServer([sys.executable, "-m", "packdata.netstore", recipe])
    host, port = child.start()      # the child printed "listening HOST PORT"
    ...
    child.stop(timeout=5)           # sends the timeout; True when every request ended in time

The child side is ``serve_until_told``: print the address, wait for the line, stop, say how it went.
A child whose parent dies sees its standard input close, and stops too.
"""

import os
import queue
import subprocess
import sys
import threading
import warnings


class ChildServer:
    """The parent's handle on a server process."""

    def __init__(self, command, name="server"):
        self.command, self.name, self.process = command, name, None

    def start(self, timeout=60):
        """Start the process; return the ``(host, port)`` it listens on, once it says so (lines it
        prints before are passed over). A process that ends first, or says nothing of the kind
        within ``timeout`` s, is stopped, and ``OSError`` says which."""
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        lines = queue.Queue()
        threading.Thread(
            target=_address_line, args=(self.process.stdout, lines), daemon=True
        ).start()
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if not line:
            self.process.kill()
            status = self.process.wait()
            self.process.stdin.close()
            self.process.stdout.close()
            self.process = None
            why = f"no address within {timeout} s" if line is None else f"exit status {status}"
            raise OSError(f"{self.name} could not start: {why}")
        host, port = line.split()[1:]
        return host, int(port)

    def stop(self, timeout=5.0):
        """Tell the process to stop, giving requests in progress ``timeout`` s; True when all of
        them ended in time. A process that had ended already (killed, say) is said so in a
        warning, with its exit status."""
        if self.process.poll() is not None:
            status = self.process.returncode
            self.process.stdin.close()
            self.process.stdout.close()
            self.process = None
            ended = f"the {self.name} process had ended already (exit status {status})"
            warnings.warn(ended, stacklevel=3)  # the caller of the server's own stop
            return True  # no request is left running
        try:
            answer, _ = self.process.communicate(f"{timeout}\n", timeout=timeout + 10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            answer = ""
        self.process = None
        return answer.strip() == "stopped"


def _address_line(stdout, lines):
    """Put the first ``listening HOST PORT`` line of ``stdout`` in ``lines``, or "" at its end."""
    for line in stdout:
        if line.startswith("listening "):
            lines.put(line)
            return
    lines.put("")


def serve_until_told(address, shut_down):
    """The child's side: print ``address``, wait for the stop line (or for standard input to
    close), call ``shut_down(timeout)`` (True when every request ended), and say so."""
    print("listening", *address, flush=True)
    timeout = float(sys.stdin.readline() or 0)
    ended = shut_down(timeout)
    try:
        print("stopped" if ended else "requests still running", flush=True)
    except BrokenPipeError:  # the parent is gone (it died, or exited without stop): nobody asks
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit either
