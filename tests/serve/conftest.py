"""Real servers on loopback ports, started as subprocesses, for the serve tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

API_KEY = "sk-test-key"
ROOT = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "deepinfer.cli", "serve"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``deepinfer serve`` in a subprocess; its output goes to a log file for failures."""

    def __init__(self, model: str | None, *flags: str, api_key: str | None = None, ready_timeout: float = 180.0):
        self.port = free_port()
        self.api_key = api_key
        self.base_url = f"http://127.0.0.1:{self.port}"
        # stays open for the server's lifetime: the subprocess writes into it
        self.log = tempfile.NamedTemporaryFile("w+", prefix="deepinfer-serve-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [*SERVE, *([model] if model else []), "--port", str(self.port),
               "--log-level", "warning", *flags]
        if api_key:
            cmd += ["--api-key", api_key]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        env.pop("DEEPINFER_API_KEY", None)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.output()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name (counters carry their ``_total`` suffix)."""
        r = httpx.get(f"{self.base_url}/metrics", headers=self.headers, timeout=10)
        r.raise_for_status()
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                key = s.name if not s.labels else f"{s.name}{sorted(s.labels.items())}"
                out[key] = s.value
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Poll /metrics until nothing runs or waits; return that snapshot."""
        deadline = time.monotonic() + timeout
        m = self.metrics()
        while time.monotonic() < deadline:
            if m["deepinfer:num_requests_running"] == 0 and m["deepinfer:num_requests_waiting"] == 0:
                return m
            time.sleep(0.05)
            m = self.metrics()
        raise AssertionError(f"server still busy after {timeout} s: {m}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen3 with a tiny byte-level BPE tokenizer and a chat template."""
    from tests.tiny_models import make_model

    path = tmp_path_factory.mktemp("serve-qwen3")
    make_model(path, "qwen3")
    return path


@pytest.fixture(scope="session")
def server(tiny_model):
    """The shared server: API key on, a 256-token context, at most 4 running + 4 waiting sequences."""
    srv = ServerProcess(str(tiny_model), "--served-model-name", "tiny", "--max-model-len", "256",
                        "--max-num-seqs", "4", "--max-waiting-requests", "4", "--max-body-bytes", "65536",
                        api_key=API_KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def offline(tiny_model):
    """The same model in this process: the reference the server's outputs must match."""
    from deepinfer.llm import LLM

    return LLM(str(tiny_model), progress=False, max_model_len=256)


@pytest.fixture()
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
