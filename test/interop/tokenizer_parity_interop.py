"""dgemma's tokenizer against HF's on a generated corpus (docs/data.md, "Tokenization").

  tokenizer_parity_interop.py PROBE TOKENIZER_DIR

Writes 12,000 records of tokenizer_corpus.py (seed 37) to a temporary file, has PROBE
(dgemma_tokenizer_probe) encode and decode every record with dgemma::Tokenizer, and compares with
transformers' AutoTokenizer of the same directory: for each record, the ids of
tokenizer(text, add_special_tokens=False) where text is the record's bytes decoded with
errors="replace" (dgemma's rule for invalid UTF-8), and decode(ids) of those ids. The first mismatch is
reported with its record number and context, with the number of mismatching records; any mismatch
fails the test.

Decoding is compared for the gpt2-bpe backend, whose contract is HF's ByteLevel decoder. The
SentencePiece and tokenizer.json backends decode by the Gemma decoder's rules (Tokenizer.h), which
the unit tests pin; their encode() is what this test holds to HF.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402

RECORDS = 12000
SEED = 37


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def main():
    probe, directory = sys.argv[1], sys.argv[2]
    records = tokenizer_corpus.corpus(SEED, RECORDS)
    texts = [r.decode("utf-8", errors="replace") for r in records]
    # The corpus has what it claims: every record kind, in numbers.
    invalid = sum(1 for r, t in zip(records, texts) if t.encode() != r)
    assert invalid >= 500, invalid
    assert sum("\n" in t for t in texts) >= 500 and sum("\u3000" in t for t in texts) >= 100
    assert sum("<|endoftext|>" in t for t in texts) >= 100 and sum("<eos>" in t for t in texts) >= 100
    assert sum("\u200d" in t for t in texts) >= 100  # ZWJ sequences

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.bin")
        tokenizer_corpus.write_corpus(path, records)
        run = subprocess.run([probe, directory, path], capture_output=True, timeout=500)
    if run.returncode != 0:
        fail(f"the probe exited with {run.returncode}: {run.stderr.decode(errors='replace')}")
    lines = run.stdout.decode().split("\n")
    backend = lines[0]
    dgemma_ids = [[int(x) for x in line.split()] for line in lines[1:2 * RECORDS:2]]
    dgemma_text = [bytes.fromhex(line).decode("utf-8") for line in lines[2:2 * RECORDS + 1:2]]
    assert len(dgemma_ids) == RECORDS and len(dgemma_text) == RECORDS, (len(dgemma_ids), len(dgemma_text))

    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(directory)
    print(f"dgemma backend {backend}, HF {type(hf).__name__} ({directory}); {RECORDS} records, "
          f"{invalid} with invalid UTF-8")
    hf_ids = hf(texts, add_special_tokens=False)["input_ids"]

    mismatches = [i for i in range(RECORDS) if dgemma_ids[i] != hf_ids[i]]
    if mismatches:
        i = mismatches[0]
        ours, theirs = dgemma_ids[i], hf_ids[i]
        at = next((k for k in range(min(len(ours), len(theirs))) if ours[k] != theirs[k]), min(len(ours), len(theirs)))
        context = lambda ids: hf.convert_ids_to_tokens(ids[max(0, at - 3):at + 4])  # noqa: E731
        fail(f"{len(mismatches)} of {RECORDS} records differ; the first is record {i} (line {i + 1}): "
             f"{records[i]!r}\n  first difference at id {at}\n  dgemma: {ours[max(0, at - 3):at + 4]} "
             f"{context(ours)}\n  HF:     {theirs[max(0, at - 3):at + 4]} {context(theirs)}")

    specials = set(hf.all_special_ids)
    assert sum(any(t in specials for t in ids) for ids in hf_ids) >= 100, "special-token strings were not matched"
    print(f"ids: all {RECORDS} records identical ({sum(map(len, hf_ids))} ids)")

    if backend == "gpt2-bpe":
        decoded = hf.batch_decode(hf_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        bad = [i for i in range(RECORDS) if dgemma_text[i] != decoded[i]]
        if bad:
            i = bad[0]
            fail(f"decode: {len(bad)} of {RECORDS} records differ; the first is record {i}:\n"
                 f"  dgemma: {dgemma_text[i]!r}\n  HF:     {decoded[i]!r}")
        # Byte-level BPE loses nothing but invalid UTF-8: decode(encode(text)) is the text.
        assert decoded == texts
        print(f"decode: all {RECORDS} records identical, and equal to the text")


if __name__ == "__main__":
    main()
