"""What the dgemma-serve tests share: a briefly trained demo checkpoint and a running server.

The checkpoint is the demo model (models/diffusion_gemma/configs/demo) trained for a few hundred
steps on data/demo: enough for confident canvases and EOS, cheap enough for every test run. It is
made once per build directory (BUILD/serve-test/demo-checkpoint, under a lock) and reused.

A server is the real dgemma-serve binary on 127.0.0.1 with an ephemeral port (--port 0, the bound
port read from its "listening on" line), stopped with SIGTERM, which must drain it to exit 0.
"""

import contextlib
import fcntl
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

SOURCE = pathlib.Path(__file__).resolve().parents[3]
DEMO_CONFIG = SOURCE / "models/diffusion_gemma/configs/demo"
TOKENIZER = SOURCE / "data/tokenizer"
DEMO_IMAGE = SOURCE / "data/demo/images/test-0000.png"
TRAIN_STEPS = 400


class Tools:
    def __init__(self, bin_dir):
        self.bin = pathlib.Path(bin_dir)
        self.compile = self.bin / "dgemma-compile"
        self.run = self.bin / "dgemma-run"
        self.serve = self.bin / "dgemma-serve"
        self.work = self.bin.parent / "serve-test"


def run(command, **kwargs):
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, command))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def demo_checkpoint(tools):
    """The trained demo checkpoint directory (config, weights and tokenizer: an HF model directory)."""
    tools.work.mkdir(parents=True, exist_ok=True)
    done = tools.work / "demo-checkpoint"
    with open(tools.work / "demo-checkpoint.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (done / "config.json").exists():
            return done
        scratch = tools.work / "demo-training"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        run([tools.compile, "--model", DEMO_CONFIG, "--mode", "train", "--preset", "demo", "--images-per-example", "1",
             "--prompt-len", "32,48,64,96", "-o", scratch / "plan"])
        run([tools.run, "train", "--plan", scratch / "plan", "--init", "random", "--seed", "1", "--tokenizer", TOKENIZER,
             "--train", SOURCE / "data/demo/train.jsonl", "--steps", str(TRAIN_STEPS), "--save-dir",
             scratch / "checkpoints"])
        step = sorted((scratch / "checkpoints").glob("step-*"))[-1]
        shutil.rmtree(done, ignore_errors=True)
        shutil.copytree(step, done)
        shutil.rmtree(scratch)
        return done


class Server:
    """A dgemma-serve process; `url` is its base URL, `stderr` what it printed so far."""

    def __init__(self, tools, model, *flags, name="demo"):
        self.name = name
        command = [tools.serve, "--model", model, "--tokenizer", TOKENIZER, "--port", "0", "--served-model-name", name,
                   "--plan-cache", tools.work / "plan-cache", "--threads", "2", *flags]
        self.process = subprocess.Popen([str(c) for c in command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.process.stderr:
                self.lines.append(line)
                found = re.search(r"listening on http://[^:]+:(\d+)", line)
                if found:
                    self.port = int(found.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(600) or self.port is None:
            self.process.kill()
            sys.exit("dgemma-serve did not start:\n" + "".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def stderr(self):
        return "".join(self.lines)

    def stop(self):
        """SIGTERM: the server drains and must exit 0."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            sys.exit("dgemma-serve did not exit within 120 s of SIGTERM:\n" + self.stderr)
        self.reader.join(10)
        self.process.stderr.close()
        if code != 0:
            sys.exit(f"dgemma-serve exited {code} after SIGTERM:\n" + self.stderr)


@contextlib.contextmanager
def serving(tools, model, *flags, name="demo"):
    server = Server(tools, model, *flags, name=name)
    try:
        yield server
    finally:
        server.stop()


def metric(text, name):
    """The value of an unlabelled series `name` in a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no series {name} in /metrics:\n{text}")


def wait_until(predicate, timeout=60, what="a condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def resident_bytes(pid):
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
