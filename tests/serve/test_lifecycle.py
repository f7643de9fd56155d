"""Startup, binding, keys from the environment, and SIGTERM under load, each on its own server process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import ROOT, SERVE, ServerProcess, free_port

pytestmark = pytest.mark.slow  # real server processes: signals, kills, grace periods


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie has exited: it only awaits its reaper
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def run_serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVE, *args, "--port", str(free_port())], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_missing_model_dir_exits_non_zero_with_the_reason(tmp_path):
    r = run_serve(str(tmp_path / "no-such-model"))
    assert r.returncode != 0
    assert "no-such-model" in r.stderr and "error" in r.stderr


def test_unknown_plugin_exits_non_zero_naming_it(tiny_model):
    r = run_serve(str(tiny_model), "--plugins", "no-such-plugin")
    assert r.returncode != 0
    assert "no-such-plugin" in r.stderr



def test_a_port_in_use_is_refused_before_the_engine_starts(tiny_model):
    """The engine would take its start-up to build (minutes on a GPU); the port is checked first."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t = time.monotonic()
        r = subprocess.run([*SERVE, str(tiny_model), "--port", str(port)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, check=False)
    assert r.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr
    assert "serving" not in r.stderr and time.monotonic() - t < 30


def test_sigterm_while_the_engine_starts_stops_the_engine_process_too(tiny_model):
    """SIGTERM once the engine process exists but before it is ready: the server exits and takes
    the engine process with it (it used to run on, orphaned)."""
    proc = subprocess.Popen([*SERVE, str(tiny_model), "--port", str(free_port())], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        engine: list[int] = []
        while not engine and time.monotonic() < deadline:  # (the engine process, spawned at start-up)
            engine = [c for c in children(proc.pid)
                      if "deepinfer-engine" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")
                      or "spawn_main" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")]
            time.sleep(0.02)
        assert engine, "no engine process appeared"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "deepinfer serve: serving" not in err and "stopped while the engine was starting" in err
    # gone by the time the server has exited (an orphan would build on for seconds, then fail)
    assert all(gone(pid, timeout=0.5) for pid in engine)

def test_binds_loopback_by_default_and_reads_the_key_from_the_environment(tiny_model):
    port = free_port()
    proc = subprocess.Popen([*SERVE, str(tiny_model), "--port", str(port),
                             "--log-level", "warning"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "DEEPINFER_API_KEY": "from-env"})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline and proc.poll() is None
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        listen = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        ours = [f[1] for f in listen if f[1].endswith(f":{port:04X}") and f[3] == "0A"]
        assert ours == [f"0100007F:{port:04X}"]  # 127.0.0.1, nothing else
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
        ok = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer from-env"}, timeout=5)
        assert ok.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def _stream(base_url: str, max_tokens: int, results: list, started: threading.Semaphore) -> None:
    body = {"model": "tiny", "prompt": "import sys", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    events = []
    admitted = False
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            admitted = True
            started.release()  # the headers come back once the engine has the request
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    except httpx.HTTPError:
        pass  # cut off by the shutdown
    finally:
        if not admitted:
            started.release()
    results.append(events)


def _load_then_sigterm(srv: ServerProcess, num: int, max_tokens: int) -> tuple[int, float, list]:
    kids = children(srv.proc.pid)
    assert kids, "the engine runs in a child process"
    results: list = []
    started = threading.Semaphore(0)
    threads = [threading.Thread(target=_stream, args=(srv.base_url, max_tokens, results, started))
               for _ in range(num)]
    for t in threads:
        t.start()
    for _ in range(num):
        assert started.acquire(timeout=60)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    with pytest.raises(httpx.HTTPError):  # admission has stopped: the port no longer takes connections
        httpx.post(f"{srv.base_url}/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=5)
    rc = srv.proc.wait(60)
    elapsed = time.monotonic() - t0
    for t in threads:
        t.join(30)
    assert all(gone(k) for k in kids), "the engine process outlived the server"
    return rc, elapsed, results


def test_sigterm_under_load_finishes_in_flight_requests_and_exits_0(tiny_model):
    srv = ServerProcess(str(tiny_model), "--served-model-name", "tiny", "--grace-period", "20")
    rc, elapsed, results = _load_then_sigterm(srv, num=6, max_tokens=150)
    assert rc == 0, srv.output()
    assert elapsed < 20 + 10
    assert len(results) == 6
    for events in results:  # every stream ran to its end
        assert events[-1] == "[DONE]"
        assert '"completion_tokens":150' in events[-2]


def test_sigterm_aborts_what_outlasts_the_grace_period_and_exits_0(tiny_model):
    """At the grace period's end, streams still running end with an error event and [DONE], a
    non-streamed request gets a JSON 503, and the log says how many were aborted."""
    # one sequence at a time: 6 x 1000 tokens take seconds, far beyond the grace period
    srv = ServerProcess(str(tiny_model), "--served-model-name", "tiny", "--grace-period", "0.5",
                        "--max-num-seqs", "1", "--max-waiting-requests", "8")
    whole: list[httpx.Response] = []
    body = {"model": "tiny", "prompt": "import os", "max_tokens": 1000, "ignore_eos": True}
    plain = threading.Thread(target=lambda: whole.append(
        httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60)))
    plain.start()
    rc, elapsed, results = _load_then_sigterm(srv, num=6, max_tokens=1000)
    plain.join(30)
    assert rc == 0, srv.output()
    assert elapsed < 0.5 + 10
    assert len(results) == 6
    aborted = [events for events in results if '"error"' in events[-2]]
    assert aborted, results
    for events in results:
        assert events[-1] == "[DONE]"
    for events in aborted:
        assert "grace period" in json.loads(events[-2])["error"]["message"]
    r = whole[0]
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
    assert "grace period" in r.json()["error"]["message"]
    assert f"aborted {len(aborted) + 1} requests still running" in srv.output()
    assert "CancelledError" not in srv.output()


def test_a_dead_engine_fails_in_flight_requests_and_stops_the_server_non_zero(tiny_model):
    srv = ServerProcess(str(tiny_model), "--served-model-name", "tiny")
    engine = [k for k in children(srv.proc.pid) if "spawn_main" in Path(f"/proc/{k}/cmdline").read_text()]
    assert len(engine) == 1
    results: list = []
    started = threading.Semaphore(0)
    t = threading.Thread(target=_stream, args=(srv.base_url, 1000, results, started))
    t.start()
    assert started.acquire(timeout=60)
    os.kill(engine[0], signal.SIGKILL)
    assert srv.proc.wait(30) == 1
    t.join(30)
    events = results[0]
    assert '"error"' in events[-2] and events[-1] == "[DONE]"  # the stream says why it ended
    assert "engine process stopped" in srv.output()
