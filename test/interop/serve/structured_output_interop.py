"""Structured output on canvases (docs/serving.md, "Structured output"), through the real `openai`
client: seeded requests to the briefly trained demo model, which knows nothing of JSON, with
several JSON schemas, json_object and regular expressions. Every response must parse and validate
(jsonschema, pinned in test/requirements.txt) or fully match, 100% of them.

    structured_output_interop.py BIN_DIR [REQUESTS_PER_FORMAT]
"""

import json
import re
import sys

import jsonschema
import openai

import serve_support as support

SCHEMAS = {
    "person": {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                              "member": {"type": "boolean"}},
               "required": ["name", "age", "member"]},
    "enum_and_number": {"type": "object",
                        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ratio": {"type": "number"}},
                        "required": ["color", "ratio"]},
    "array": {"type": "object",
              "properties": {"sums": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
              "required": ["sums"]},
    "optional": {"type": "object",
                 "properties": {"answer": {"type": "integer"}, "note": {"type": "string", "maxLength": 4}},
                 "required": ["answer"]},
}
REGEXES = [r"[0-9]{1,3}", r"(yes|no), [a-z]{2,5}\.", r"\d+ \+ \d+ = \d+"]
PROMPTS = ["What is 58 + 67?", "Describe the picture.", "Give the answer as JSON.", "12 + 9"]
MAX_TOKENS = 48


def main():
    tools = support.Tools(sys.argv[1])
    per_format = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    checkpoint = support.demo_checkpoint(tools)
    checked = failures = 0
    with support.serving(tools, checkpoint, "--max-num-seqs", "8", "--prompt-len", "64", "--max-new-tokens",
                         str(MAX_TOKENS), "--images-per-example", "0") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        def ask(seed, response_format):
            response = client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": PROMPTS[seed % len(PROMPTS)]}], seed=seed,
                max_tokens=MAX_TOKENS, temperature=1.0, response_format=response_format,
                extra_body={"denoising_steps": 12})
            return response.choices[0].message.content

        formats = [(name, {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}, schema)
                   for name, schema in SCHEMAS.items()]
        formats.append(("json_object", {"type": "json_object"}, {"type": "object"}))
        for name, response_format, schema in formats:
            for seed in range(per_format):
                text = ask(seed, response_format)
                checked += 1
                try:
                    jsonschema.validate(json.loads(text), schema)
                except (ValueError, jsonschema.ValidationError) as error:
                    failures += 1
                    print(f"FAIL {name} seed {seed}: {text!r}: {error}")
            print(f"{name}: {per_format} responses, e.g. {text}")
        for pattern in REGEXES:
            for seed in range(per_format):
                text = ask(seed, {"type": "regex", "regex": pattern})
                checked += 1
                if not re.fullmatch(pattern, text):
                    failures += 1
                    print(f"FAIL regex {pattern} seed {seed}: {text!r}")
            print(f"regex {pattern}: {per_format} responses, e.g. {text!r}")

        # A schema outside the subset, and one that cannot fit the budget, are 400s naming response_format.
        for bad in ({"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}},
                    {"type": "object", "properties": {f"key{i}": {"type": "integer"} for i in range(20)},
                     "required": [f"key{i}" for i in range(20)]}):
            try:
                ask(0, {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
                failures += 1
                print(f"FAIL: expected a 400 for {bad}")
            except openai.BadRequestError as error:
                assert error.param == "response_format", error
    print(f"structured output: {checked - failures}/{checked} responses parse and validate")
    sys.exit(1 if failures or checked < 100 else 0)


if __name__ == "__main__":
    main()
