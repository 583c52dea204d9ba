"""``callgate serve --http`` imports its HTTP server before any thread starts.

The runner's thread may import the MCP SDK (an MCP upstream's first call), which imports
uvicorn; the main thread imports uvicorn to serve. Two threads importing it at once met its
circular import half done (``cannot import name 'Server' from partially initialized module
'uvicorn.main'``) and ``serve`` exited. The program below refuses to start a thread before
uvicorn is imported (but the command line's signal thread, which imports nothing), then
runs ``serve --http`` until it answers, and is stopped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tools.ports import free_port, wait_port

PROGRAM = """
import sys, threading
start = threading.Thread.start
def guarded(self):
    if "uvicorn" not in sys.modules and self.name != "callgate-stop-signals":
        print(f"thread {self.name} started before uvicorn was imported", file=sys.stderr)
        sys.stderr.flush()
        import os; os._exit(3)
    start(self)
threading.Thread.start = guarded
from callgate.surfaces.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_serve_http_imports_its_server_before_it_starts_a_thread(tmp_path: Path) -> None:
    port = free_port()
    args = ["--state-dir", str(tmp_path / "state"), "--dev", "serve", "--http", f"127.0.0.1:{port}"]
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        serve = subprocess.Popen(
            [sys.executable, "-c", PROGRAM, *args], stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            wait_port(port, serve, log)
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=30)
    said = log.read_text(errors="replace")
    assert "started before uvicorn" not in said
    assert serve.returncode == 0, said
