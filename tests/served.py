"""`python -m engine serve` in a child process for the tests that talk to it over HTTP."""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

TINY = ["--model", "synthetic:tiny-llama", "--backend", "numpy"]


class Served:
    """A running server: `url` (no /v1), `proc`; `stop()` ends it with SIGTERM (kill() to crash it)."""

    def __init__(self, *args: str, timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "engine", "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.errors: list[str] = []  # its stderr, read all along so the pipe never fills
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.errors.extend(self.proc.stderr), daemon=True).start()
        self.url = self.model = ""
        deadline = time.monotonic() + timeout
        while not self.model:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"server did not start: {self.stderr}") from None
            if line is None:
                code = self.proc.wait()
                time.sleep(0.2)  # the rest of its stderr
                raise RuntimeError(f"server exited {code}: {self.stderr}")
            if line.startswith("serving on "):
                self.url = line.split()[2]
            elif line.startswith("ready: "):
                self.model = line.split()[1]

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    @property
    def stderr(self) -> str:
        return "".join(self.errors)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
