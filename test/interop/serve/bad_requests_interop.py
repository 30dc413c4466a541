"""dgemma-serve under bad and hostile clients (docs/serving.md, "Errors"): each gets its documented
status in OpenAI's error JSON and the server keeps serving. Raw HTTP (http.client and sockets), as
such clients are not well-behaved SDKs.

    bad_requests_interop.py BIN_DIR
"""

import http.client
import json
import socket
import sys
import threading
import time
import unittest

import serve_support as support

TOOLS = None
SERVER = None


def setUpModule():
    global SERVER
    SERVER = support.Server(TOOLS, support.demo_checkpoint(TOOLS), "--max-num-seqs", "2", "--max-queued", "2",
                            "--prompt-len", "64", "--max-new-tokens", "32", "--max-body-mib", "1",
                            "--images-per-example", "0", "--idle-timeout", "60")


def tearDownModule():
    SERVER.stop()


def request(method, path, body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", SERVER.port, timeout=300)
    connection.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response, data


def chat_body(**fields):
    body = {"model": "demo", "messages": [{"role": "user", "content": "What is 1 + 2?"}], "seed": 1, "max_tokens": 8}
    body.update(fields)
    return json.dumps(body)


def metrics():
    return request("GET", "/metrics")[1].decode()


class BadRequests(unittest.TestCase):
    def assertError(self, response, data, status, param=None):
        self.assertEqual(response.status, status, data)
        error = json.loads(data)["error"]
        self.assertIsInstance(error["message"], str)
        self.assertIsInstance(error["type"], str)
        if param is not None:
            self.assertEqual(error["param"], param, error)
        return error

    def tearDown(self):
        response, _ = request("POST", "/v1/chat/completions", chat_body())
        self.assertEqual(response.status, 200, "the server must go on serving")

    def test_malformed_json(self):
        response, data = request("POST", "/v1/chat/completions", '{"model": "demo", "messages": [')
        self.assertIn("offset", self.assertError(response, data, 400)["message"])

    def test_wrong_types(self):
        self.assertError(*request("POST", "/v1/chat/completions", chat_body(messages=5)), 400, "messages")
        self.assertError(*request("POST", "/v1/chat/completions", chat_body(max_tokens="many")), 400, "max_tokens")
        self.assertError(*request("POST", "/v1/chat/completions", chat_body(stream="yes")), 400, "stream")
        self.assertError(*request("POST", "/v1/completions", json.dumps({"model": "demo", "prompt": [1, "a"]})), 400)

    def test_oversized_body(self):
        response, data = request("POST", "/v1/chat/completions", chat_body(messages=[{"role": "user",
                                                                                      "content": "x" * (2 << 20)}]))
        self.assertEqual(response.status, 413, data)

    def test_unknown_model_route_and_method(self):
        self.assertEqual(self.assertError(*request("POST", "/v1/chat/completions", chat_body(model="other")), 404,
                                          "model")["code"], "model_not_found")
        self.assertError(*request("GET", "/v1/embeddings"), 404)
        self.assertError(*request("GET", "/v1/chat/completions"), 405)

    def test_a_prompt_longer_than_every_bucket(self):
        error = self.assertError(*request("POST", "/v1/chat/completions",
                                          chat_body(messages=[{"role": "user", "content": "7" * 200}])), 400)
        self.assertIn("prompt", error["message"])

    def test_health_and_metrics(self):
        response, data = request("GET", "/health")
        self.assertEqual((response.status, json.loads(data)), (200, {"status": "ok"}))
        text = metrics()
        for family in ("dgemma_queue_depth", "dgemma_active_slots", "dgemma_requests_total", "dgemma_step_seconds_bucket",
                       "dgemma_batch_occupancy_bucket", "dgemma_completion_tokens_total"):
            self.assertIn(family, text)

    def test_a_client_that_disconnects_mid_stream_frees_its_slot(self):
        sock = socket.create_connection(("127.0.0.1", SERVER.port))
        body = chat_body(stream=True, max_tokens=32, denoising_steps=4096, entropy_bound=1e-9)
        sock.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        self.assertIn(b"200", sock.recv(4096))
        support.wait_until(lambda: support.metric(metrics(), "dgemma_active_slots") == 1, what="the stream's slot")
        sock.close()
        support.wait_until(lambda: support.metric(metrics(), "dgemma_active_slots") == 0, timeout=30,
                           what="the disconnected stream's slot to be freed")

    def test_a_full_server_refuses_with_retry_after(self):
        # Two slots and two queue places: of eight long requests at once, some must be refused.
        statuses, retry = [], []
        body = chat_body(max_tokens=32, denoising_steps=200, entropy_bound=1e-9)

        def send():
            response, data = request("POST", "/v1/chat/completions", body)
            statuses.append(response.status)
            if response.status == 503:
                retry.append(response.getheader("Retry-After"))
                self.assertEqual(json.loads(data)["error"]["type"], "service_unavailable_error")

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertIn(503, statuses)
        self.assertIn(200, statuses)
        self.assertTrue(all(value and int(value) >= 1 for value in retry), retry)
        self.assertEqual(set(statuses), {200, 503})

    def test_a_thousand_idle_connections(self):
        idle = [socket.create_connection(("127.0.0.1", SERVER.port)) for _ in range(1000)]
        try:
            started = time.monotonic()
            response, _ = request("POST", "/v1/chat/completions", chat_body())
            self.assertEqual(response.status, 200)
            print(f"answered beside 1000 idle connections in {time.monotonic() - started:.2f} s")
            self.assertGreaterEqual(support.metric(metrics(), "dgemma_open_connections"), 1000)
        finally:
            for sock in idle:
                sock.close()


class Drain(unittest.TestCase):
    def test_sigterm_lets_a_stream_finish(self):
        server = support.Server(TOOLS, support.demo_checkpoint(TOOLS), "--max-num-seqs", "2", "--prompt-len", "64",
                                "--max-new-tokens", "32", "--images-per-example", "0")
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        connection.request("POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=32, denoising_steps=100,
                                                                      entropy_bound=1e-9),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        first = response.readline()
        self.assertTrue(first.startswith(b"data: "), first)
        server.process.send_signal(15)
        rest = response.read().decode()
        self.assertTrue(rest.rstrip().endswith("data: [DONE]"), rest[-200:])
        connection.close()
        server.stop()  # exits 0 after draining


if __name__ == "__main__":
    TOOLS = support.Tools(sys.argv.pop(1))
    unittest.main(verbosity=2)
