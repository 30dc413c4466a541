"""dgemma's c10d TCP store against PyTorch's own, both ways (docs/parallelism.md, "The TCP store").

Usage: tcp_store_interop.py PROBE   (PROBE: the dgemma_tcp_store_probe binary; run with the test
venv's Python, which has torch)

1. torch's TCPStore server (what torchrun's agent serves) and dgemma's client: keys set on either
   side are read on the other, ADD keeps torch's counter, a missing key times out.
2. dgemma's TcpStoreServer and torch's client: set, get, add, check, wait, num_keys, delete_key.
"""
import datetime
import os
import subprocess
import sys
import tempfile
import time

from torch.distributed import TCPStore


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def expect(condition, message):
    if not condition:
        fail(message)
    print("ok:", message)


def torch_server_dgemma_client(probe):
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=20))
    server.set("probe/from-torch", "beta")
    server.add("probe/counter", 2)
    result = subprocess.run([probe, "client", "127.0.0.1", str(server.port)], capture_output=True,
                            text=True, timeout=60)
    print(result.stdout + result.stderr)
    expect(result.returncode == 0, "dgemma's client ran against torch's TCPStore server")
    expect("read beta" in result.stdout, "dgemma read the key torch set")
    expect("sum 7" in result.stdout, "dgemma's ADD continued torch's counter (2 + 5)")
    expect("missing key timed out" in result.stdout, "a key nobody set timed out in dgemma's client")
    expect(server.get("probe/from-dgemma") == b"alpha", "torch read the key dgemma set")
    expect(server.add("probe/counter", 0) == 7, "torch reads the counter dgemma added to")


def dgemma_server_torch_client(probe):
    with tempfile.TemporaryDirectory() as work:
        port_file = os.path.join(work, "port")
        server = subprocess.Popen([probe, "serve", port_file])
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if time.time() > deadline or server.poll() is not None:
                fail("dgemma's TcpStoreServer did not start")
            time.sleep(0.05)
        port = int(open(port_file).read())
        client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=20))
        client.set("key", "value")
        expect(client.get("key") == b"value", "torch's client set and got a key on dgemma's server")
        expect(client.add("counter", 3) == 3 and client.add("counter", 4) == 7, "ADD sums on dgemma's server")
        expect(client.check(["key", "counter"]), "CHECK finds set keys")
        expect(not client.check(["absent"]), "CHECK misses an unset key")
        client.wait(["key"])
        expect(client.num_keys() >= 2, "GETNUMKEYS counts the keys")
        expect(client.delete_key("key"), "DELETE_KEY removes a key")
        expect(not client.check(["key"]), "a deleted key is gone")
        try:
            client.wait(["absent"], datetime.timedelta(milliseconds=300))
            fail("torch's wait for an unset key returned")
        except Exception as error:  # torch raises DistStoreError on a timeout
            expect("timeout" in str(error).lower() or "timed out" in str(error).lower(),
                   "torch's wait for an unset key timed out on dgemma's server: " + str(error).splitlines()[0])
        client.set("after-wait", "still served")
        expect(client.get("after-wait") == b"still served", "the server still answers after a cancelled wait")
        del client
        expect(server.wait(timeout=30) == 0, "dgemma's TcpStoreServer stopped once its client left")


def main():
    probe = sys.argv[1]
    torch_server_dgemma_client(probe)
    dgemma_server_torch_client(probe)
    print("PASS: dgemma's TCP store speaks torch's c10d protocol both ways")


if __name__ == "__main__":
    main()
