"""Compares two dgemma metrics files (docs/cli.md, "Metrics file") line by line.

Usage: compare_metrics.py [--train-lines N] REFERENCE CANDIDATE

Every line must be a JSON object; the two files must have the same lines in the same order with the
same fields and values, but for timing fields (any field whose name contains "second"), which
depend on the machine and are left out. Values are compared as parsed JSON (a float's text is
`%.9g` / `%.17g`, which round-trips, so equal text and equal value are the same thing). With
--train-lines N the reference must hold exactly N train lines (steps 1..N). Prints what it
compared; exits 1 naming the first difference.
"""
import argparse
import json
import sys


def is_timing(field):
    return "second" in field


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        sys.exit(f"compare_metrics: FAIL: cannot read {path}: {error}")
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            sys.exit(f"compare_metrics: FAIL: {path}:{number}: not JSON ({error}): {line!r}")
        if not isinstance(record, dict):
            sys.exit(f"compare_metrics: FAIL: {path}:{number}: not a JSON object: {line!r}")
        lines.append(record)
    return lines


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-lines", type=int)
    parser.add_argument("reference")
    parser.add_argument("candidate")
    args = parser.parse_args()

    reference, candidate = read(args.reference), read(args.candidate)
    train = [r.get("step") for r in reference if r.get("split") == "train"]
    if args.train_lines is not None and train != list(range(1, args.train_lines + 1)):
        sys.exit(f"compare_metrics: FAIL: {args.reference}: expected train lines for steps 1..{args.train_lines}, "
                 f"found steps {train}")
    ignored = sorted({f for r in reference + candidate for f in r if is_timing(f)})
    compared = []
    for record in reference:
        for field in record:
            if not is_timing(field) and field not in compared:
                compared.append(field)
    print(f"compare_metrics: reference {args.reference}: {len(reference)} lines ({len(train)} train)")
    print(f"compare_metrics: candidate {args.candidate}: {len(candidate)} lines")
    print(f"compare_metrics: comparing {', '.join(compared)}; ignoring the timing fields {', '.join(ignored) or '(none)'}")

    for number, (want, got) in enumerate(zip(reference, candidate), 1):
        want_fields = {k: v for k, v in want.items() if not is_timing(k)}
        got_fields = {k: v for k, v in got.items() if not is_timing(k)}
        if want_fields != got_fields:
            differences = [f"{k}: reference {want_fields.get(k, '(absent)')!r}, candidate {got_fields.get(k, '(absent)')!r}"
                           for k in list(want_fields) + [k for k in got_fields if k not in want_fields]
                           if want_fields.get(k, "(absent)") != got_fields.get(k, "(absent)")]
            print(f"compare_metrics: FAIL: line {number} (step {want.get('step')}, {want.get('split')}) differs:")
            for difference in differences:
                print(f"  {difference}")
            sys.exit(1)
        if want.get("split") == "train":
            print(f"compare_metrics:   step {want['step']}: loss {want.get('loss')} grad_norm {want.get('grad_norm')} equal")
    if len(reference) != len(candidate):
        print(f"compare_metrics: FAIL: the reference has {len(reference)} lines, the candidate {len(candidate)}")
        sys.exit(1)
    print(f"compare_metrics: all {len(reference)} lines equal")


if __name__ == "__main__":
    main()
