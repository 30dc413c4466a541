"""A bounded load test of dgemma-serve on loopback (docs/serving.md, "Load test").

    python bench/serve_load.py --bin BUILD/bin [--model small-20m|demo] [--requests 64]
        [--concurrency 1,4,16,64] [--soak-seconds 600] [--sequential-generate 16]

Starts the real server (serve_support.Server), then for each concurrency level sends a fixed number
of streamed chat requests with the real `openai` client (each request a new seed, max_tokens fixed)
and prints one table row: completion tok/s, time to first chunk and end-to-end latency (p50, p99),
errors, and the server's resident memory. --soak-seconds keeps the highest concurrency running that
long and prints resident memory every 30 s with its spread (flat means within +-5%).
--sequential-generate N runs N `dgemma-run generate --prompt` commands one after another on the same
model, the way a user without a server would, for comparison. Stops by itself.

small-20m (models/diffusion_gemma/configs/small-20m.json) runs from random weights: a one-step
training run writes its checkpoint. Its canvases never become confident, so every canvas takes all
its denoising steps: the throughput of a fixed amount of work.
"""

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "test/interop/serve"))
import serve_support as support  # noqa: E402

import openai  # noqa: E402

PROMPT = "What is 58 + 67?"


def small_checkpoint(tools):
    """small-20m from random weights: a one-step training run's checkpoint (an HF model directory)."""
    target = tools.work / "small-20m-checkpoint"
    if (target / "config.json").exists():
        return target
    scratch = tools.work / "small-20m-training"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    support.run([tools.compile, "--model", support.SOURCE / "models/diffusion_gemma/configs/small-20m.json", "--mode",
                 "train", "--micro-batch", "1", "--prompt-len", "64", "-o", scratch / "plan"])
    support.run([tools.run, "train", "--plan", scratch / "plan", "--init", "random", "--seed", "1", "--tokenizer",
                 support.TOKENIZER, "--train", "mock", "--steps", "1", "--lr", "0",
                 "--save-dir", scratch / "checkpoints"])
    shutil.copytree(sorted((scratch / "checkpoints").glob("step-*"))[-1], target)
    shutil.rmtree(scratch)
    return target


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def one_request(client, seed, max_tokens, steps):
    started = time.perf_counter()
    first = None
    tokens = 0
    stream = await client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": PROMPT}], seed=seed, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"denoising_steps": steps} if steps else None)
    async for chunk in stream:
        if first is None:
            first = time.perf_counter() - started
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return first, time.perf_counter() - started, tokens


async def level(url, concurrency, requests, max_tokens, steps, seed_base):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    queue = list(range(requests))
    results, errors = [], []

    async def worker():
        while queue:
            index = queue.pop()
            try:
                results.append(await one_request(client, seed_base + index, max_tokens, steps))
            except Exception as error:  # every failure is counted and shown, none stops the level
                errors.append(repr(error))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    await client.close()
    return seconds, results, errors


def row(name, seconds, results, errors, rss):
    tokens = sum(r[2] for r in results)
    firsts = [r[0] for r in results if r[0] is not None]
    totals = [r[1] for r in results]
    print(f"{name:>12} {len(results):>8} {tokens / seconds:>10.1f} {percentile(firsts, 50):>9.3f} "
          f"{percentile(firsts, 99):>9.3f} {percentile(totals, 50):>9.3f} {percentile(totals, 99):>9.3f} "
          f"{len(errors):>6} {rss / 2**20:>9.1f}", flush=True)
    for error in errors[:3]:
        print("   error:", error)
    return tokens / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", required=True)
    parser.add_argument("--model", default="small-20m", choices=["small-20m", "demo"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="denoising steps per canvas (the request extension)")
    parser.add_argument("--soak-seconds", type=float, default=0)
    parser.add_argument("--sequential-generate", type=int, default=0)
    args = parser.parse_args()
    tools = support.Tools(args.bin)
    model = small_checkpoint(tools) if args.model == "small-20m" else support.demo_checkpoint(tools)
    flags = ["--max-num-seqs", str(args.slots), "--max-queued", "1024", "--prompt-len", "64", "--max-new-tokens",
             str(args.max_tokens), "--images-per-example", "0"]
    print(f"dgemma-serve load test: model {args.model}, {args.slots} slots, {args.requests} requests per level, "
          f"max_tokens {args.max_tokens}, {args.steps} denoising steps per canvas, {os.cpu_count()} CPU cores")
    with support.serving(tools, model, *flags, name="bench") as server:
        asyncio.run(level(server.url, 1, 1, args.max_tokens, args.steps, 10**6))  # warm-up
        print(f"{'concurrency':>12} {'requests':>8} {'tok/s':>10} {'ttfc p50':>9} {'ttfc p99':>9} {'e2e p50':>9} "
              f"{'e2e p99':>9} {'errors':>6} {'RSS MiB':>9}")
        rates = {}
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            seconds, results, errors = asyncio.run(level(server.url, concurrency, args.requests, args.max_tokens,
                                                         args.steps, concurrency * 10**4))
            rates[concurrency] = row(str(concurrency), seconds, results, errors, support.resident_bytes(server.process.pid))
        if 1 in rates and 16 in rates:
            print(f"16 concurrent clients / one at a time: {rates[16] / rates[1]:.1f}x the total tok/s")
        if args.soak_seconds > 0:
            concurrency = max(rates)
            samples = []
            deadline = time.monotonic() + args.soak_seconds
            print(f"soak: concurrency {concurrency} for {args.soak_seconds:.0f} s")
            while time.monotonic() < deadline:
                seconds, results, errors = asyncio.run(level(server.url, concurrency, concurrency * 2, args.max_tokens,
                                                             args.steps, len(samples) * 10**5))
                samples.append(support.resident_bytes(server.process.pid))
                if errors:
                    print("   soak errors:", errors[:3])
                if len(samples) % 5 == 1:
                    print(f"   t={args.soak_seconds - (deadline - time.monotonic()):6.0f} s  RSS {samples[-1] / 2**20:.1f} MiB",
                          flush=True)
            low, high = min(samples[1:] or samples), max(samples[1:] or samples)
            middle = (low + high) / 2
            print(f"soak RSS: {low / 2**20:.1f} .. {high / 2**20:.1f} MiB, spread +-{100 * (high - low) / 2 / middle:.2f}%")
    if args.sequential_generate > 0:
        plan = tools.work / f"generate-plan-{args.model}"
        if not (plan / "rank-0.dgplan").exists():
            support.run([tools.compile, "--model", model, "--mode", "infer", "--micro-batch", "1", "--prompt-len", "64",
                         "--max-new-tokens", str(args.max_tokens), "-o", plan])
        generation = json.loads((model / "generation_config.json").read_text()) \
            if (model / "generation_config.json").exists() else {}
        pad = generation.get("pad_token_id", 0)
        started = time.perf_counter()
        tokens = 0
        for seed in range(args.sequential_generate):
            out = support.run([tools.run, "generate", "--plan", plan, "--weights", model, "--tokenizer", support.TOKENIZER,
                               "--seed", str(seed), "--steps", str(args.steps), "--prompt", PROMPT, "--json",
                               "--threads", str(os.cpu_count())])
            result = json.loads(out.stdout.splitlines()[0])
            # The server's count: the tokens up to the budget that are not pad (the EOS included).
            tokens += min(len(result["tokens"]) - result["tokens"].count(pad), args.max_tokens)
        seconds = time.perf_counter() - started
        print(f"{args.sequential_generate} sequential `dgemma-run generate --prompt` calls: {seconds:.1f} s, "
              f"{tokens / seconds:.1f} tok/s ({seconds / args.sequential_generate:.2f} s each)")


if __name__ == "__main__":
    main()
