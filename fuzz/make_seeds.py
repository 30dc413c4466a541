#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/ (docs/fuzzing.md) except the plan and manifest seeds,
which this build's own writers produce (scripts/fuzz.sh --write-plan-seeds, --write-manifest-seed).
Seeds are small valid inputs copied from test/fixtures and data/, plus hand-made edge cases; the
dictionaries of fuzz/dict/ are the JSON keys and string values of the seeds.
Usage: fuzz/make_seeds.py (from anywhere)."""
import json
import pathlib
import re
import shutil
import struct
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
DICT = ROOT / "fuzz" / "dict"
FIXTURES = ROOT / "test" / "fixtures"


def write(target, name, data):
    path = CORPUS / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def copy(target, source, name=None):
    write(target, name or source.name, source.read_bytes())


def jsonl_seeds():
    demo = (ROOT / "data" / "demo" / "train.jsonl").read_text().splitlines()
    write("jsonl_row", "demo.jsonl", "\n".join(demo[:4]) + "\n")
    copy("jsonl_row", FIXTURES / "batch" / "rows.jsonl")
    rows = [
        {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
                      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                      {"role": "user", "content": "again"}], "completion": ""},
        {"messages": [{"role": "user", "content": "x"}]},
    ]
    write("jsonl_row", "roles.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    write("jsonl_row", "crlf-bom-blank.jsonl",
          b"\xef\xbb\xbf" + json.dumps(rows[0]).encode() + b"\r\n\r\n  \t\n" + json.dumps(rows[0]).encode())
    write("jsonl_row", "nul-in-row.jsonl", b'{"messages": [{"role": "user", "content": "a\x00b"}], "completion": "c"}\n')
    write("jsonl_row", "duplicate-key.jsonl", '{"messages": [], "messages": [], "completion": "c"}\n')
    write("jsonl_row", "deep.jsonl", '{"messages": ' + "[" * 300 + "]" * 300 + ', "completion": ""}\n')


def chat_seeds():
    write("chat_template", "plain.txt", "What is 37 + 49?")
    write("chat_template", "turns.txt", "You are terse.\x1eWhat animal is this?\x1eA cat.\x1eAnd this one?")
    write("chat_template", "specials.txt", "<bos><|turn>user\nhi<turn|>\n<|turn>model\n<eos><pad><image><boi><eoi>")
    write("chat_template", "thinking.txt", "<|channel>thought\nhidden<channel|>  answer  \x1e<|channel>unclosed")
    write("chat_template", "unicode.txt", "  caf\u00e9 \u65e5\u672c\u8a9e \U0001f600 \u00a0\u2003\u3000tabs\t\n")
    write("chat_template", "bytes.txt", b"\xff\xfe\xc3\x28 <0x41> \xe2\x82")
    corpus = (ROOT / "data" / "tokenizer" / "corpus.txt").read_bytes()
    write("chat_template", "corpus-head.txt", corpus[:1500])


def gpt2_bpe_seeds():
    # vocab.json 0x1E merges.txt 0x1E text (fuzz/fuzz_gpt2_bpe.cpp): the fixture's 256 byte characters and
    # its first 60 merges, then files that fail each check; text alone goes to the fixture tokenizer only.
    fixture = FIXTURES / "gpt2_bpe"
    full = json.loads((fixture / "vocab.json").read_text(encoding="utf-8"))
    merges = [line for line in (fixture / "merges.txt").read_text(encoding="utf-8").split("\n")[1:61]]
    vocab = {token: i for token, i in full.items() if i < 256}
    for merge in merges:
        merged = merge.replace(" ", "")
        vocab[merged] = full[merged]
    vocab["<|endoftext|>"] = full["<|endoftext|>"]
    text = "Hello, wörld!  it's 42 \u65e5\u672c\u8a9e <|endoftext|>\t\n\n \U0001f469\U0001f3fb\u200d\U0001f4bb".encode()

    def seed(name, vocab_json, merges_txt, body=text):
        write("gpt2_bpe", name, vocab_json.encode() + b"\x1e" + merges_txt.encode() + b"\x1e" + body)

    seed("small.bin", json.dumps(vocab, ensure_ascii=False), "#version: 0.2\n" + "\n".join(merges) + "\n")
    seed("crlf-invalid-utf8.bin", json.dumps(vocab), "#version: 0.2\r\n" + "\r\n".join(merges[:10]),
         b"\xff\xc3 ab\xe2\x82 \xed\xa0\x80" + text)
    seed("bad-merge-line.bin", json.dumps(vocab), merges[0] + "\n" + merges[1].replace(" ", ""))
    seed("merge-not-in-vocab.bin", json.dumps(vocab), "a xyz\n")
    seed("missing-byte.bin", json.dumps({k: v for k, v in vocab.items() if k != "\u0100"}), "")
    seed("duplicate-id.bin", json.dumps(dict(vocab, word=5)), "")
    seed("not-an-object.bin", json.dumps(list(vocab)), "")
    model = {"type": "BPE", "vocab": vocab, "merges": [m.split(" ") for m in merges], "ignore_merges": True}
    seed("tokenizer-json-model.bin", json.dumps({"model": model}), "")
    write("gpt2_bpe", "text-only.txt", text + b" <|endoftext <|endoftext|>\xf0\x9f " + "\u3000".encode())


def png(width, height, color_type, bit_depth, rows):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def image_seeds():
    for name in ["tiny.png", "gray.png", "photo.jpg", "truncated.png", "not_an_image.txt"]:
        copy("image", FIXTURES / "images" / name)
    copy("image", ROOT / "data" / "demo" / "images" / "test-0000.png", "demo.png")
    # A palette image without its PLTE chunk, which libpng must refuse.
    write("image", "palette.png", png(2, 2, 3, 8, [b"\x00\x01", b"\x01\x00"]))
    write("image", "gray16.png", png(2, 1, 0, 16, [b"\x00\x01\xff\xff"]))
    write("image", "p6.ppm", b"P6\n2 2\n255\n" + bytes(range(12)))
    write("image", "p5.pgm", b"P5\n3 1\n255\n\x00\x80\xff")
    write("image", "p5-truncated.pgm", b"P5\n4 4\n255\n\x00")
    bmp_pixels = b"\x00\x00\xff\x00\xff\x00\x00\x00"  # 2x1, 24-bit, row padded to 8 bytes
    write("image", "tiny.bmp", b"BM" + struct.pack("<IHHI", 14 + 40 + len(bmp_pixels), 0, 0, 54)
          + struct.pack("<IiiHHIIiiII", 40, 2, 1, 1, 24, 0, len(bmp_pixels), 2835, 2835, 0, 0) + bmp_pixels)
    write("image", "tiny.gif", bytes.fromhex(
        "4749463839610100010080000000000000ffffff21f90401000000002c00000000010001000002024401003b"))


def safetensors(tensors, metadata=None, pad=True):
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    write("safetensors", "two.safetensors", safetensors(
        [("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f" * 3)],
        {"format": "pt"}))
    write("safetensors", "dtypes.safetensors", safetensors(
        [("i64", "I64", [1], struct.pack("<q", -1)), ("i32", "I32", [2], struct.pack("<2i", 1, 2)),
         ("f16", "F16", [1, 1], b"\x00\x3c"), ("u8", "U8", [2], b"\x01\x02"), ("bool", "BOOL", [1], b"\x01"),
         ("empty", "F32", [0, 4], b""), ("scalar", "F32", [], struct.pack("<f", 5))]))
    write("safetensors", "empty.safetensors", safetensors([], {}))
    write("safetensors", "overlap.safetensors", struct.pack("<Q", 96) + json.dumps(
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
         "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode().ljust(96) + b"\0" * 4)


def config_seeds():
    for model in ["hf_tester", "all_experts", "seven_layers"]:
        copy("config", FIXTURES / "diffusion_gemma" / model / "config.json", model + ".json")
    copy("config", FIXTURES / "diffusion_gemma" / "seven_layers" / "config_legacy.json", "legacy.json")
    copy("config", FIXTURES / "diffusion_gemma_vision" / "one_image" / "config.json", "vision.json")
    text = json.loads((FIXTURES / "diffusion_gemma" / "hf_tester" / "config.json").read_text())
    write("config", "bare-text-config.json", json.dumps(text.get("text_config", text)))
    for model in ["hf_tester", "seven_layers"]:
        copy("generation_config", FIXTURES / "generation" / model / "generation_config.json", model + ".json")
    copy("generation_config", FIXTURES / "diffusion_gemma" / "hf_tester" / "generation_config.json", "nulls.json")
    # The issue 15 cases: a deep array in an unknown field, a head count of 2^62.
    write("config", "deep-unknown-field.json", '{"model_type": "diffusion_gemma_text", "extra": ' + "[" * 2000 + "]" * 2000 + "}")
    text["num_attention_heads"] = 2**62
    write("config", "huge-heads.json", json.dumps(text))


def manifest_seeds():
    # Edge cases beside saved.json (scripts/fuzz.sh --write-manifest-seed): deep JSON, a huge count.
    saved = CORPUS / "manifest" / "saved.json"
    write("manifest", "deep.json", '{"format": "dgemma-checkpoint", "model": ' + "[" * 2000 + "]" * 2000 + "}")
    if saved.exists():
        manifest = json.loads(saved.read_text())
        manifest["consumed_samples"] = 2**62
        write("manifest", "huge-consumed-samples.json", json.dumps(manifest))


def strings_of(value, found):
    if isinstance(value, dict):
        for key, item in value.items():
            found.add(key)
            strings_of(item, found)
    elif isinstance(value, list):
        for item in value:
            strings_of(item, found)
    elif isinstance(value, str) and len(value) <= 40:
        found.add(value)


def json_dictionary(target, extra=()):
    found = set(extra)
    for path in sorted((CORPUS / target).iterdir()):
        data = path.read_bytes()
        # JSON lines, plain JSON, or the JSON header inside a plan or safetensors file.
        for match in re.finditer(rb"\{.*\}", data, re.S):
            for text in match.group(0).split(b"\n"):
                try:
                    strings_of(json.loads(text), found)
                except (ValueError, RecursionError):
                    pass
            try:
                strings_of(json.loads(match.group(0)), found)
            except (ValueError, RecursionError):
                pass
    tokens = ['"{"', '"}"', '"["', '"]"', '":"', '","', '"null"', '"true"', '"false"', '"-1"', '"1e308"',
              '"18446744073709551616"', '"9223372036854775807"', '"\\\\u0000"']
    tokens += [json.dumps(json.dumps(text)) for text in sorted(found)]
    DICT.mkdir(exist_ok=True)
    (DICT / f"{target}.dict").write_text(
        "# JSON tokens and the keys and strings of fuzz/corpus/%s (fuzz/make_seeds.py)\n" % target + "\n".join(tokens) + "\n")


def main():
    for target in ["jsonl_row", "chat_template", "gpt2_bpe", "image", "safetensors", "config", "generation_config"]:
        shutil.rmtree(CORPUS / target, ignore_errors=True)
    jsonl_seeds()
    chat_seeds()
    gpt2_bpe_seeds()
    image_seeds()
    safetensors_seeds()
    config_seeds()
    manifest_seeds()
    json_dictionary("jsonl_row", ["system", "user", "assistant", "text", "image"])
    json_dictionary("gpt2_bpe", ["<|endoftext|>", "#version: 0.2"])
    json_dictionary("safetensors", ["F64", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2"])
    for target in ["config", "generation_config", "plan", "manifest"]:
        if (CORPUS / target).is_dir() and any((CORPUS / target).iterdir()):
            json_dictionary(target)


if __name__ == "__main__":
    main()
