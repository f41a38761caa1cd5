import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
AGENT = os.path.join(HERE, "agents", "e2e_agent.py")
AIO_AGENT = os.path.join(HERE, "agents", "aio_agent.py")
# request_step/request_done (docs/protocol.md): named explicitly for a supervisor that
# does not know them yet; harmless for one that does.
STEP_FLAGS = ["--wal-operations", "request_step,request_done"]
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))


@pytest.fixture(scope="session")
def supervisor_bin(tmp_path_factory):
    out = tmp_path_factory.mktemp("bin") / "supervisor"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/supervisor"], cwd=REPO, check=True)
    return str(out)


def wait_until(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Supervisor:
    def __init__(self, binary, tmp, mode, flags=(), env=None, agent=AGENT):
        self.bin, self.dir = binary, str(tmp / "data")
        self.report = str(tmp / "report.txt")
        self.log = str(tmp / "supervisor.log")
        self.mode, self.flags, self.extra_env = mode, list(flags), env or {}
        self.proc = None
        self.agent = agent

    def start(self):
        env = dict(os.environ, AGENT_REPORT=self.report, AGENT_MODE=self.mode, **self.extra_env)
        env["PYTHONPATH"] = os.path.abspath(os.path.join(HERE, ".."))
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [self.bin, "run", "--data-dir", self.dir, "--http-addr", "127.0.0.1:0", *self.flags,
             "--", sys.executable, self.agent], env=env, stdout=self._logf, stderr=self._logf)
        return self

    def events(self):
        try:
            with open(self.report) as f:
                # a line without its newline is still being written
                return [ast.literal_eval(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def wait_event(self, name, count=1, timeout=20.0, **match):
        def find():
            evs = [e for e in self.events() if e["event"] == name and all(e.get(k) == v for k, v in match.items())]
            return evs[count - 1] if len(evs) >= count else None
        try:
            return wait_until(find, timeout, f"agent event {name!r} #{count}")
        except AssertionError:
            raise AssertionError(f"no event {name} #{count}; events: {self.events()}\nlog tail:\n{self.log_text()[-3000:]}")

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def http_addr(self):
        def find():
            m = re.findall(r'HTTP listener up.*?addr=(\S+)', self.log_text())
            return m[-1] if m else None
        return wait_until(find, 20, "HTTP listener up")

    def wait_ready(self, timeout=20):
        def ready():
            try:
                with urllib.request.urlopen(f"http://{self.http_addr()}/readyz", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(ready, timeout, "/readyz 200")

    def agent_pid(self):
        out = subprocess.run([self.bin, "status", "--data-dir", self.dir, "--json"],
                             capture_output=True, text=True).stdout
        try:
            return json.loads(out).get("agent_pid")
        except (ValueError, AttributeError):
            return None

    def post_request(self, message, wait="5s", **extra):
        body = json.dumps(dict(message=message, **extra)).encode()
        req = urllib.request.Request(f"http://{self.http_addr()}/v1/requests?wait={wait}", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())

    def http(self, method, path, body=None):
        """(status, JSON body) of one HTTP call; error statuses are returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.http_addr()}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw or b"null")
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def submit(self, message, **extra):
        """POST /v1/requests without waiting: (status, body), 202 {request_id} when accepted."""
        return self.http("POST", "/v1/requests", dict(message=message, **extra))

    def request_status(self, rid):
        return self.http("GET", f"/v1/requests/{rid}")

    def cancel_request(self, rid):
        return self.http("DELETE", f"/v1/requests/{rid}")

    def wait_answer(self, rid, timeout=30):
        """GET /v1/requests/ID until it is no longer pending; its body."""
        def done():
            st, body = self.request_status(rid)
            return body if st == 200 and isinstance(body, dict) and body.get("status") != "pending" else None
        return wait_until(done, timeout, f"request {rid} answered")

    def checkpoints(self):
        out = subprocess.run([self.bin, "checkpoints", "list", "--data-dir", self.dir, "--json"],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def stop(self, timeout=30):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode if self.proc else None


@pytest.fixture
def run_supervisor(supervisor_bin, tmp_path):
    started = []

    def start(mode, flags=(), env=None, agent=AGENT):
        s = Supervisor(supervisor_bin, tmp_path, mode, flags, env, agent).start()
        started.append(s)
        return s

    yield start
    for s in started:
        try:
            s.stop()
        except Exception:
            pass
