#!/usr/bin/env python3
"""Reads dgemma's TensorBoard event files with the real `tensorboard` package.

Usage: tensorboard_reader_test.py FIXTURE_WRITER
Runs the fixture writer (TensorBoardFixtureMain.cpp) into a temporary directory, loads it with
TensorBoard's EventAccumulator and checks tags, steps and fp32 values, including the restart purge
that the resumed writer's SessionLog START triggers. Run by the venv's python (test/requirements.txt
pins tensorboard); a missing package is a failure, not a skip.
"""
import struct
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader


def f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def check(condition, message):
    if not condition:
        print(f"FAIL: {message}")
        sys.exit(1)


def main():
    writer = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="dgemma-tb-") as logdir:
        subprocess.run([writer, logdir], check=True)

        accumulator = EventAccumulator(logdir)  # purge_orphaned_data is on by default
        accumulator.Reload()
        tags = sorted(accumulator.Tags()["scalars"])
        check(tags == ["train/loss", "train/lr", "validation/loss"], f"scalar tags {tags}")

        # Steps 4 and 5 of the first run were purged by the resumed run's SessionLog START at step 4.
        loss = [(e.step, e.value) for e in accumulator.Scalars("train/loss")]
        expected = [(1, 1.0), (2, 0.5), (3, f32(1.0 / 3.0)), (4, 14.0), (5, 15.0), (6, 16.0)]
        check(loss == expected, f"train/loss {loss}, expected {expected}")

        lr = [(e.step, e.value) for e in accumulator.Scalars("train/lr")]
        expected_lr = [(s, f32(f32(2.5e-6) * s)) for s in range(1, 7)]
        check(lr == expected_lr, f"train/lr {lr}, expected {expected_lr}")

        validation = [(e.step, e.value) for e in accumulator.Scalars("validation/loss")]
        check(validation == [(2, 1.0)], f"validation/loss {validation}")
        for event in accumulator.Scalars("train/loss"):
            check(event.wall_time > 1.6e9, f"wall_time {event.wall_time}")

        # Each file on its own through the raw record loader (which checks both CRCs of every record).
        import os

        files = sorted(f for f in os.listdir(logdir) if "tfevents" in f)
        check(len(files) == 2, f"event files {files}")
        for name in files:
            check(name.startswith("events.out.tfevents.") and ".fixture" in name, f"file name {name}")
            events = list(LegacyEventFileLoader(os.path.join(logdir, name)).Load())
            check(events[0].file_version == "brain.Event:2", f"{name}: first event {events[0]}")
        resumed = list(LegacyEventFileLoader(os.path.join(logdir, files[1])).Load())
        check(resumed[1].HasField("session_log") and resumed[1].session_log.status == 1 and resumed[1].step == 4,
              f"resumed file's second event {resumed[1]}")
    print("PASS: TensorBoard reads dgemma's event files")


if __name__ == "__main__":
    main()
