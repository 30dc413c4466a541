"""dgemma's indexed datasets against the real megatron-core (docs/pretraining.md, "Indexed datasets",
"Preprocessing"), both ways.

Usage: indexed_dataset_interop.py DGEMMA_RUN TOKENIZER_DIR   (run with the test venv's Python, which
has megatron-core, torch and tokenizers; TOKENIZER_DIR holds a tokenizer.json)

1. dgemma-run preprocess writes a corpus of mixed scripts, whitespace runs, special-token strings,
   empty texts and pre-split sentences; megatron-core's IndexedDataset reads every document as the
   HF tokenizers library tokenizes it (add_special_tokens=False), EOS appended, as preprocess_data.py
   does; and the files are byte for byte those of Megatron's own pipeline: megatron-core's
   HuggingFaceTokenizer and IndexedDatasetBuilder driven as Megatron-LM's tools/preprocess_data.py
   drives them (that script is not in the wheel; megatron_preprocess below follows it).
2. megatron-core's IndexedDatasetBuilder writes datasets of every integer dtype, documents of several
   sequences, empty documents, a merged index (add_index) and the multimodal variant's modes;
   dgemma-run inspect-data reads the same tokens, boundaries and modes.
3. The same corpus gzip'd (under a .jsonl name), and with 1 and 2 workers: the same bytes.
4. A bad line: exit code 2, "FILE:LINE: FIELD: expected ...", no output file left; with
   --skip-bad-lines it is listed and skipped.
"""
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")  # megatron-core warns that Transformer Engine and Apex are absent

import numpy
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder
from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer
from tokenizers import Tokenizer


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def expect(condition, message):
    if not condition:
        fail(message)
    print("ok:", message)


PIECES = ["Hello", "world", "Größe", "Ελληνικά", "русский", "中文字符", "日本語", "한국어", "🙂👍🏽", "∑∫√",
          "def f(x):", "return x", "<eos>", "<bos>", "<|turn>", "naïve", "café", "1234567", "--", "...",
          "\t", "   ", "\n", "  \n\n ", "a", "b", "ab"]


def random_text(rng):
    return "".join(rng.choice(PIECES) + rng.choice(["", " ", "  ", "\t", "\n"]) for _ in range(rng.randint(0, 30)))


def make_corpus(rng, count):
    rows = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.05:
            rows.append({"text": "", "id": i})  # a document without tokens
        elif kind < 0.15:
            rows.append({"text": [random_text(rng) for _ in range(rng.randint(1, 4))], "id": i})
        else:
            rows.append({"text": random_text(rng), "id": i})
    return rows


def run(args, expect_code=0):
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if result.returncode != expect_code:
        fail(f"{' '.join(args)} exited {result.returncode}, expected {expect_code}:\n{result.stdout}{result.stderr}")
    return result


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as out:
        for row in rows:
            # Half the rows with \u escapes, half as raw UTF-8: dgemma's JSON reader decodes both.
            out.write(json.dumps(row, ensure_ascii=row["id"] % 2 == 0) + "\n")


def expected_documents(rows, tokenizer, eos):
    documents = []
    for row in rows:
        texts = row["text"] if isinstance(row["text"], list) else [row["text"]]
        sequences = [ids for ids in (tokenizer.encode(text, add_special_tokens=False).ids for text in texts) if ids]
        if sequences:
            sequences[-1] = sequences[-1] + [eos]
        documents.append(sequences)
    return documents


def megatron_documents(prefix):
    dataset = IndexedDataset(prefix)
    boundaries = dataset.document_indices.tolist()
    return dataset, [[dataset[s].tolist() for s in range(boundaries[d], boundaries[d + 1])]
                     for d in range(len(boundaries) - 1)]


def megatron_preprocess(rows, tokenizer_dir, prefix):
    # preprocess_data.py's Encoder.encode and process_json_file with --append-eod, one JSON key, no
    # sentence splitting: a list value is its sentences, empty ones dropped, EOD ends the last.
    tokenizer = HuggingFaceTokenizer(tokenizer_dir)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tokenizer.vocab_size))
    for row in rows:
        sentences = row["text"] if isinstance(row["text"], list) else [row["text"]]
        doc_ids, sentence_lens = [], []
        for sentence in sentences:
            ids = tokenizer.text_to_ids(sentence)
            if ids:
                doc_ids.extend(ids)
                sentence_lens.append(len(ids))
        if doc_ids:
            doc_ids.append(tokenizer.eod)
            sentence_lens[-1] += 1
        builder.add_document(doc_ids, sentence_lens)
    builder.finalize(prefix + ".idx")


def dgemma_to_megatron(dgemma_run, tokenizer_dir, work):
    rng = random.Random(37)
    rows = make_corpus(rng, 3000)
    corpus = os.path.join(work, "corpus.jsonl")
    write_jsonl(corpus, rows)
    prefix = os.path.join(work, "dgemma")
    result = run([dgemma_run, "preprocess", "--input", corpus, "--json-keys", "text", "--tokenizer", tokenizer_dir,
                  "--output-prefix", prefix, "--workers", "2"])
    print(result.stdout.strip())
    tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    eos = tokenizer.token_to_id("<eos>")
    expected = expected_documents(rows, tokenizer, eos)
    dataset, documents = megatron_documents(prefix)
    expect(dataset.index.dtype == numpy.uint16, "megatron-core reads dgemma's dtype code as uint16 (256 pieces < 65500)")
    expect(len(documents) == len(rows), f"megatron-core finds {len(rows)} documents")
    for i, (got, want) in enumerate(zip(documents, expected)):
        if got != want:
            fail(f"document {i} ({json.dumps(rows[i])[:200]}): megatron-core read {got}, HF tokenizes {want}")
    sequences = sum(len(d) for d in expected)
    expect(len(dataset) == sequences, f"the same {sequences} sequences, every token as HF's tokenizer has it, EOS last")
    expect(any(len(d) == 0 for d in documents) and any(len(d) > 1 for d in documents),
           "empty documents and documents of several sequences among them")
    megatron = os.path.join(work, "megatron_pipeline")
    megatron_preprocess(rows, tokenizer_dir, megatron)
    for suffix in (".bin", ".idx"):
        same = open(prefix + suffix, "rb").read() == open(megatron + suffix, "rb").read()
        expect(same, f"{suffix}: byte-identical to Megatron's preprocessing pipeline on the same corpus")
    return rows, corpus, prefix


def megatron_to_dgemma(dgemma_run, work):
    rng = numpy.random.default_rng(16)
    dtypes = [numpy.uint8, numpy.int8, numpy.int16, numpy.uint16, numpy.int32, numpy.int64]
    for dtype in dtypes:
        info = numpy.iinfo(dtype)
        prefix = os.path.join(work, f"megatron_{dtype.__name__}")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        documents = []
        for d in range(40):
            sequences = [rng.integers(info.min, info.max, size=rng.integers(0, 50), endpoint=True).tolist()
                         for _ in range(rng.integers(0, 4))]
            if d == 0:
                sequences = [[int(info.min), int(info.max)]]
            if d % 2:
                builder.add_document(torch.tensor(sum(sequences, []), dtype=torch.int64), [len(s) for s in sequences])
            else:
                for sequence in sequences:
                    builder.add_item(torch.tensor(sequence, dtype=torch.int64))
                builder.end_document()
            documents.append(sequences)
        builder.finalize(prefix + ".idx")
        check_dgemma_reads(dgemma_run, prefix, dtype.__name__, documents, None)

    # The multimodal variant: an int8 mode per sequence after the document indices.
    prefix = os.path.join(work, "megatron_multimodal")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32, multimodal=True)
    documents, modes = [[[1, 2, 3], [4]], [[5, 6]]], [0, 1, -3]
    builder.add_item(torch.tensor([1, 2, 3]), mode=0)
    builder.add_item(torch.tensor([4]), mode=1)
    builder.end_document()
    builder.add_item(torch.tensor([5, 6]), mode=-3)
    builder.end_document()
    builder.finalize(prefix + ".idx")
    check_dgemma_reads(dgemma_run, prefix, "int32", documents, modes)
    dataset = IndexedDataset(prefix, multimodal=True)
    # (its sequence_modes property asserts on an array, a bug of 0.16.1: read the index's array)
    expect(dataset.index.sequence_modes.tolist() == modes, "megatron-core reads the modes it wrote, as dgemma did")

    # add_index: two datasets merged into one index, as Megatron's merge_datasets.py does.
    merged = os.path.join(work, "megatron_merged")
    builder = IndexedDatasetBuilder(merged + ".bin", dtype=numpy.uint16)
    builder.add_index(os.path.join(work, "megatron_uint16"))
    builder.add_index(os.path.join(work, "dgemma"))
    builder.finalize(merged + ".idx")
    _, want = megatron_documents(merged)
    check_dgemma_reads(dgemma_run, merged, "uint16", want, None)


def check_dgemma_reads(dgemma_run, prefix, dtype, documents, modes):
    dump = json.loads(run([dgemma_run, "inspect-data", "--prefix", prefix, "--json", "--tokens"]).stdout)
    boundaries = [0]
    for sequences in documents:
        boundaries.append(boundaries[-1] + len(sequences))
    name = os.path.basename(prefix)
    expect(dump["dtype"] == dtype, f"{name}: dgemma reads the dtype {dtype}")
    expect(dump["document_indices"] == boundaries, f"{name}: dgemma reads megatron-core's document indices")
    expect(dump["sequences"] == [s for d in documents for s in d], f"{name}: dgemma reads every token of every sequence")
    expect(dump["sequence_modes"] == modes, f"{name}: sequence modes {modes}")


def gzip_and_workers(dgemma_run, tokenizer_dir, work, rows, corpus, prefix):
    compressed = os.path.join(work, "compressed.jsonl")  # gzip, told by its bytes, not its name
    write_jsonl(compressed, rows, gzip.open)
    for workers, source, name in [(1, corpus, "one_worker"), (2, compressed, "gzip")]:
        other = os.path.join(work, name)
        result = run([dgemma_run, "preprocess", "--input", source, "--json-key", "text", "--tokenizer", tokenizer_dir,
                      "--output-prefix", other, "--workers", str(workers)])
        print(result.stdout.strip())
        for suffix in (".bin", ".idx"):
            same = open(prefix + suffix, "rb").read() == open(other + suffix, "rb").read()
            expect(same, f"{name} ({workers} worker(s)): {suffix} byte-identical to the plain 2-worker output")


def bad_lines(dgemma_run, tokenizer_dir, work):
    cases = [('{"text": 5}', "text: expected a string or an array of strings, got number"),
             ('{"body": "x"}', "text: expected a string or an array of strings, got nothing (the key is missing)"),
             ('{"text": ["a", 7]}', "text[1]: expected a string, got number"),
             ('not json', "row: expected"),
             ('{"text": "ok", "text": "twice"}', 'text: expected each key once in an object, got "text" twice')]
    for index, (line, message) in enumerate(cases):
        corpus = os.path.join(work, f"bad{index}.jsonl")
        with open(corpus, "w") as out:
            out.write('{"text": "fine"}\n' * 700 + line + "\n" + '{"text": "fine"}\n' * 10)
        out_dir = os.path.join(work, f"bad{index}")
        os.mkdir(out_dir)
        prefix = os.path.join(out_dir, "out")
        args = [dgemma_run, "preprocess", "--input", corpus, "--tokenizer", tokenizer_dir, "--output-prefix", prefix,
                "--workers", "2"]
        result = run(args, expect_code=2)
        expect(f"{corpus}:701: {message}" in result.stderr, f"bad line {line!r}: {result.stderr.strip()}")
        expect(os.listdir(out_dir) == [], "no output file left behind")
        result = run(args + ["--skip-bad-lines"])
        expect(f"skipped: {corpus}:701: {message}" in result.stderr and "1 skipped" in result.stdout,
               "--skip-bad-lines lists the line and counts it")
        expect(len(IndexedDataset(prefix)) == 710, "and keeps the 710 good lines")


def main():
    dgemma_run, tokenizer_dir = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as work:
        rows, corpus, prefix = dgemma_to_megatron(dgemma_run, tokenizer_dir, work)
        megatron_to_dgemma(dgemma_run, work)
        gzip_and_workers(dgemma_run, tokenizer_dir, work, rows, corpus, prefix)
        bad_lines(dgemma_run, tokenizer_dir, work)
    print("indexed dataset interop: all checks passed")


if __name__ == "__main__":
    main()
