"""dgemma-serve driven by the real `openai` Python client (test/requirements.txt pins it).

    openai_client_interop.py BIN_DIR

On a briefly trained demo model (serve_support.py): models, chat and text completions, streamed and
not, usage, n, stop strings, seeds (a request's text is `dgemma-run generate --prompt`'s for the same
seed), an image message, the draft-canvas extension, errors mapped to the client's exception types,
and curl showing the SSE stream.
"""

import base64
import json
import subprocess
import sys
import unittest

import openai

import serve_support as support

TOOLS = None
SERVER = None
CLIENT = None
API_KEY = "interop-test-key"
MAX_NEW_TOKENS = 32
PROMPT = "What is 58 + 67?"


def setUpModule():
    global SERVER, CLIENT
    checkpoint = support.demo_checkpoint(TOOLS)
    SERVER = support.Server(TOOLS, checkpoint, "--max-num-seqs", "4", "--prompt-len", "32,96", "--max-new-tokens",
                            str(MAX_NEW_TOKENS), "--api-key", API_KEY)
    CLIENT = openai.OpenAI(base_url=SERVER.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


def tearDownModule():
    SERVER.stop()


def chat(**kwargs):
    arguments = {"model": "demo", "messages": [{"role": "user", "content": PROMPT}], "seed": 7,
                 "max_tokens": MAX_NEW_TOKENS}
    arguments.update(kwargs)
    return CLIENT.chat.completions.create(**arguments)


class Models(unittest.TestCase):
    def test_the_served_name_is_listed(self):
        models = CLIENT.models.list()
        self.assertEqual([model.id for model in models.data], ["demo"])
        self.assertEqual(models.data[0].object, "model")


class ChatCompletions(unittest.TestCase):
    def test_a_completion_has_text_usage_and_a_finish_reason(self):
        response = chat()
        self.assertEqual(response.object, "chat.completion")
        self.assertEqual(response.model, "demo")
        self.assertEqual(len(response.choices), 1)
        choice = response.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertIsInstance(choice.message.content, str)
        self.assertIn(choice.finish_reason, ("stop", "length"))
        self.assertGreater(response.usage.prompt_tokens, 5)
        self.assertGreaterEqual(response.usage.completion_tokens, 1)
        self.assertLessEqual(response.usage.completion_tokens, MAX_NEW_TOKENS)
        self.assertEqual(response.usage.total_tokens, response.usage.prompt_tokens + response.usage.completion_tokens)

    def test_the_same_seed_gives_the_same_text_as_dgemma_run_generate(self):
        first = chat(seed=11).choices[0].message.content
        self.assertEqual(chat(seed=11).choices[0].message.content, first)
        # dgemma-run generate on a plan of its own with the same seed: the request's draws are keyed
        # by (seed, request 0, canvas, step) in both, and a row does not depend on its batch.
        plan = TOOLS.work / "generate-plan"
        if not (plan / "rank-0.dgplan").exists():
            support.run([TOOLS.compile, "--model", support.demo_checkpoint(TOOLS), "--mode", "infer", "--micro-batch",
                         "1", "--images-per-example", "1", "--prompt-len", "32,96", "--max-new-tokens",
                         str(MAX_NEW_TOKENS), "-o", plan])
        generated = support.run([TOOLS.run, "generate", "--plan", plan, "--weights", support.demo_checkpoint(TOOLS),
                                 "--tokenizer", support.TOKENIZER, "--seed", "11", "--prompt", PROMPT, "--json"])
        self.assertEqual(json.loads(generated.stdout.splitlines()[0])["text"], first)
        others = {chat(seed=seed).choices[0].message.content for seed in range(20, 26)}
        self.assertGreater(len(others | {first}), 1, "different seeds must be able to differ")

    def test_n_choices_are_the_seeds_draw_requests(self):
        single = chat(seed=5).choices[0].message.content
        response = chat(seed=5, n=3)
        self.assertEqual([choice.index for choice in response.choices], [0, 1, 2])
        self.assertEqual(response.choices[0].message.content, single)
        self.assertEqual(response.usage.completion_tokens >= 3, True)

    def test_a_stop_string_ends_the_text_before_it(self):
        for seed in range(40, 60):
            text = chat(seed=seed, temperature=1.5).choices[0].message.content
            if len(text) >= 3:
                break
        stop = text[1:3]
        response = chat(seed=seed, temperature=1.5, stop=[stop])
        self.assertEqual(response.choices[0].message.content, text[:text.index(stop)])
        self.assertEqual(response.choices[0].finish_reason, "stop")

    def test_a_streamed_completion_is_the_same_text_in_chunks(self):
        whole = chat(seed=3, temperature=1.5)
        chunks = list(chat(seed=3, temperature=1.5, stream=True, stream_options={"include_usage": True}))
        self.assertTrue(all(chunk.object == "chat.completion.chunk" for chunk in chunks))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
        self.assertEqual(finishes, [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)

    def test_drafts_show_each_denoising_step(self):
        chunks = list(chat(seed=3, stream=True, stream_options={"include_drafts": True}))
        drafts = [chunk.choices[0].model_extra["draft"] for chunk in chunks
                  if chunk.choices and chunk.choices[0].model_extra and "draft" in chunk.choices[0].model_extra]
        self.assertGreater(len(drafts), 1)
        self.assertEqual((drafts[0]["canvas"], drafts[0]["step"]), (0, 0))
        self.assertTrue(all(isinstance(draft["text"], str) for draft in drafts))
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        self.assertEqual(text, chat(seed=3).choices[0].message.content, "drafts add no text")

    def test_an_image_message_is_answered(self):
        url = "data:image/png;base64," + base64.b64encode(support.DEMO_IMAGE.read_bytes()).decode()
        response = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                              {"type": "text", "text": "Describe the picture."}]}])
        self.assertIsInstance(response.choices[0].message.content, str)
        text_only = chat(messages=[{"role": "user", "content": "Describe the picture."}])
        self.assertGreater(response.usage.prompt_tokens, text_only.usage.prompt_tokens, "the image's soft tokens count")


class TextCompletions(unittest.TestCase):
    def test_completions_streamed_and_not(self):
        whole = CLIENT.completions.create(model="demo", prompt="12 + 34 =", max_tokens=8, seed=2, temperature=1.5)
        self.assertEqual(whole.object, "text_completion")
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        self.assertLessEqual(whole.usage.completion_tokens, 8)
        chunks = list(CLIENT.completions.create(model="demo", prompt="12 + 34 =", max_tokens=8, seed=2,
                                                temperature=1.5, stream=True))
        self.assertEqual("".join(chunk.choices[0].text for chunk in chunks), whole.choices[0].text)


class Errors(unittest.TestCase):
    def test_errors_map_to_the_clients_exceptions(self):
        with self.assertRaises(openai.NotFoundError) as caught:
            chat(model="gpt-4o")
        self.assertEqual(caught.exception.code, "model_not_found")
        with self.assertRaises(openai.BadRequestError) as caught:
            chat(temperature=5)
        self.assertEqual(caught.exception.param, "temperature")
        with self.assertRaises(openai.BadRequestError):
            chat(n=0)
        with self.assertRaises(openai.BadRequestError):
            chat(max_tokens=MAX_NEW_TOKENS + 1)
        with self.assertRaises(openai.BadRequestError):
            chat(messages=[{"role": "user", "content": "x" * 500}])  # longer than every prompt bucket
        wrong_key = openai.OpenAI(base_url=SERVER.url + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            wrong_key.models.list()
        # The server still serves.
        self.assertIsInstance(chat().choices[0].message.content, str)


class Adapter(unittest.TestCase):
    def test_an_adapter_is_served_as_dgemma_run_generate_runs_it(self):
        # A LoRA adapter trained briefly over the checkpoint (a PEFT directory), served with --adapter:
        # the text equals `dgemma-run generate --adapter` for the same seed, and differs from the base's.
        base = support.demo_checkpoint(TOOLS)
        work = TOOLS.work / "adapter"
        adapters = ["--lora", "8:16", "--lora-targets", "attention,mlp,experts"]
        if not (work / "adapter" / "adapter_config.json").exists():
            support.run([TOOLS.compile, "--model", base, "--mode", "train", "--preset", "demo", "--images-per-example",
                         "1", "--prompt-len", "32,48,64,96", *adapters, "-o", work / "train-plan"])
            support.run([TOOLS.run, "train", "--plan", work / "train-plan", "--weights", base, "--seed", "1",
                         "--tokenizer", support.TOKENIZER, "--train", support.SOURCE / "data/demo/train.jsonl",
                         "--steps", "40", "--lr", "3e-2", "--save-dir", work / "checkpoints", "--overwrite"])
            (work / "adapter").unlink(missing_ok=True)
            (work / "adapter").symlink_to(sorted((work / "checkpoints").glob("step-*"))[-1])
            support.run([TOOLS.compile, "--model", base, "--mode", "infer", "--micro-batch", "1",
                         "--images-per-example", "1", "--prompt-len", "32,96", "--max-new-tokens", str(MAX_NEW_TOKENS),
                         *adapters, "-o", work / "infer-plan"])
        prompts = [f"What is {a} + {b}?" for a, b in ((58, 67), (12, 9), (70, 45), (33, 99))]
        with support.serving(TOOLS, base, "--adapter", work / "adapter", "--max-num-seqs", "2", "--prompt-len", "32,96",
                             "--max-new-tokens", str(MAX_NEW_TOKENS)) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            served = [client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                                     seed=4, max_tokens=MAX_NEW_TOKENS).choices[0].message.content
                      for prompt in prompts]
        for prompt, text in zip(prompts, served):
            generated = support.run([TOOLS.run, "generate", "--plan", work / "infer-plan", "--weights", base,
                                     "--adapter", work / "adapter", "--tokenizer", support.TOKENIZER, "--seed", "4",
                                     "--prompt", prompt, "--json"])
            self.assertEqual(json.loads(generated.stdout.splitlines()[0])["text"], text, prompt)
        base_texts = [chat(messages=[{"role": "user", "content": prompt}], seed=4).choices[0].message.content
                      for prompt in prompts]
        self.assertNotEqual(served, base_texts, "the adapter must change something for the check to mean it")


class Curl(unittest.TestCase):
    def test_curl_shows_the_sse_stream(self):
        body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": PROMPT}], "seed": 7,
                           "stream": True, "max_tokens": 8})
        result = subprocess.run(["curl", "-sS", "-N", "-H", "Authorization: Bearer " + API_KEY, "-H",
                                 "Content-Type: application/json", "-d", body, SERVER.url + "/v1/chat/completions"],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        events = [line for line in result.stdout.split("\n\n") if line]
        print("curl -N:\n" + "\n\n".join(events[:3]) + "\n...\n" + events[-1])
        self.assertTrue(all(event.startswith("data: ") for event in events))
        self.assertEqual(events[-1], "data: [DONE]")
        first = json.loads(events[0][len("data: "):])
        self.assertEqual(first["object"], "chat.completion.chunk")


if __name__ == "__main__":
    TOOLS = support.Tools(sys.argv.pop(1))
    unittest.main(verbosity=2)
