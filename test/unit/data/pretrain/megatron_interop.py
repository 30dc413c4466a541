"""dgemma's pre-training dataset against megatron-core (docs/pretraining.md).

Usage: megatron_interop.py PROBE   (run with the test venv's Python: megatron-core 0.16.1, torch
       and numpy of test/requirements.txt; PROBE is dgemma_pretrain_megatron_probe)

For generated corpora (empty documents, documents longer than a sample), blends of one to three
sources, every split part and several sample lengths, the probe prints what dgemma builds and this
script checks it against megatron-core's own code:
- the split ranges: parse_and_normalize_split, convert_split_vector_to_split_matrix and the builder's
  int(round(bookend * D)) (a part megatron-core builds no dataset for is empty in dgemma);
- the samples asked of each source: _get_size_per_split_per_dataset with the default
  mid_level_dataset_surplus 0.005;
- the blend order: helpers_cpp.build_blending_indices over the normalized weights;
- the epochs: GPTDataset._get_num_epochs;
- the sample starts: helpers_cpp.build_sample_idx over dgemma's document order (dgemma's shuffles
  use Philox, not numpy's RandomState, so the orders themselves are dgemma's);
- every sample's tokens and documents: GPTDataset._query_document_sample_shuffle_indices reading
  the documents through dgemma's three index arrays.
"""
import json
import random
import subprocess
import sys
import types
import warnings

warnings.filterwarnings("ignore")

import numpy  # noqa: E402
from megatron.core.datasets import helpers_cpp  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import _get_size_per_split_per_dataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_config import (  # noqa: E402
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)
from megatron.core.datasets.gpt_dataset import GPTDataset  # noqa: E402
from megatron.core.datasets.utils import normalize  # noqa: E402

SURPLUS = 0.005  # BlendedMegatronDatasetConfig.mid_level_dataset_surplus's default


class Documents:
    """What GPTDataset reads from an IndexedDataset: get(index, offset, length)."""

    def __init__(self, documents):
        self.documents = documents

    def get(self, index, offset=0, length=None):
        document = self.documents[index]
        end = len(document) if length is None else offset + length
        return numpy.array(document[offset:end], dtype=numpy.int64)


def make_corpus(rng, count, max_length, source):
    documents = []
    for d in range(count):
        length = 0 if rng.random() < 0.1 else rng.randint(1, max_length)
        documents.append([source * 1_000_000 + d * 1000 + offset for offset in range(length)])
    return documents


def expected_ranges(split, documents):
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    return [None if bookends is None else [int(round(b * float(documents))) for b in bookends] for bookends in matrix]


def check(case, probe):
    probed = subprocess.run([probe], input=json.dumps(case), capture_output=True, text=True, check=True)
    answer = json.loads(probed.stdout)
    failures = []

    def expect(condition, what):
        if not condition:
            failures.append(what)

    weights = normalize(case["weights"])
    n = case["num_samples"]
    for k, documents in enumerate(case["sources"]):
        for part, (mine, theirs) in enumerate(zip(answer["ranges"][k], expected_ranges(case["split"], len(documents)))):
            expect(mine[0] == mine[1] if theirs is None else mine == theirs,
                   f"source {k} part {part}: range {mine}, megatron-core {theirs}")

    dataset_index = numpy.zeros(n, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(n, dtype=numpy.int64)
    helpers_cpp.build_blending_indices(
        dataset_index, dataset_sample_index, numpy.array(weights), len(weights), n, False)
    expect(answer["blend"]["source"] == dataset_index.tolist(), "blend order differs from build_blending_indices")
    expect(answer["blend"]["sample"] == dataset_sample_index.tolist(), "blend sample numbers differ")
    requested = [sizes[0] for sizes in _get_size_per_split_per_dataset(weights, [n], surplus=SURPLUS)]

    S = case["sequence_length"]
    for k, dataset in enumerate(answer["datasets"]):
        documents = case["sources"][k]
        begin, end = answer["ranges"][k][case["part"]]
        sizes = numpy.array([len(d) for d in documents], dtype=numpy.int32)
        tokens_per_epoch = int(sizes[begin:end].sum())
        # dgemma asks at least the samples the blend takes; here that is megatron-core's count.
        expect(dataset["requested"] == requested[k],
               f"source {k}: asked {dataset['requested']}, megatron-core {requested[k]}")
        stub = types.SimpleNamespace(
            num_samples=dataset["requested"],
            config=types.SimpleNamespace(sequence_length=S, add_extra_token_to_sequence=1))
        epochs = GPTDataset._get_num_epochs(stub, tokens_per_epoch)
        expect(dataset["epochs"] == epochs, f"source {k}: {dataset['epochs']} epochs, megatron-core {epochs}")
        order = numpy.array(dataset["document_order"], dtype=numpy.int32)
        sample_index = helpers_cpp.build_sample_idx_int64(sizes, order, S, epochs, tokens_per_epoch, True, 1)
        expect(dataset["sample_starts"] == sample_index.reshape(-1).tolist(), f"source {k}: sample starts differ")
        expect(len(dataset["sample_order"]) == len(sample_index) - 1, f"source {k}: sample count differs")

        reader = object.__new__(GPTDataset)
        reader.dataset = Documents(documents)
        reader.config = types.SimpleNamespace(sequence_length=S, add_extra_token_to_sequence=1)
        reader.document_index = order
        reader.sample_index = sample_index
        reader.shuffle_index = numpy.array(dataset["sample_order"], dtype=numpy.int64)
        reader._pad_token_id = -1
        for i, sample in enumerate(dataset["samples"]):
            tokens, document_ids = reader._query_document_sample_shuffle_indices(i)
            # megatron-core lists a document it reads no tokens of (an empty one); dgemma has no segment for it.
            read = [d for d in document_ids.tolist() if len(documents[d]) > 0]
            if tokens.tolist() != sample["tokens"] or read != sample["documents"]:
                failures.append(f"source {k} sample {i}: tokens or documents differ from GPTDataset's")
                break
    return failures


def main():
    probe = sys.argv[1]
    rng = random.Random(20261207)
    cases = 0
    failures = []
    for weights in ([1.0], [0.7, 0.3], [2.0, 1.0, 1.0]):
        for split, part in (("969,30,1", 0), ("8,1,1", 1), ("6,2,2", 2), ("1,1", 0)):
            for S in (4, 17, 64):
                sources = [make_corpus(rng, rng.randint(30, 90), rng.choice([5, 40, 150]), k)
                           for k in range(len(weights))]
                case = {"sources": sources, "weights": weights, "split": split, "part": part,
                        "sequence_length": S, "seed": rng.randint(0, 2**63), "num_samples": rng.randint(20, 300)}
                failures += [f"{weights} {split} part {part} S {S}: {f}" for f in check(case, probe)]
                cases += 1
    for failure in failures:
        print("FAIL", failure)
    print(f"{cases} cases, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
