// Writes the event files that tensorboard_reader_test.py reads with the real TensorBoard package:
// a first run that logs steps 1..5 (validation at 2 and 4), then a run resumed from step 3 that
// logs steps 4..6 with different values. Usage: dgemma_train_tensorboard_fixture LOGDIR
#include <cstdio>
#include <exception>

#include "runtime/train/TensorBoardWriter.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOGDIR\n", argv[0]);
    return 2;
  }
  try {
    {
      dgemma::TensorBoardWriter first = dgemma::TensorBoardWriter::open(argv[1], {.hostname = "fixture"});
      for (int step = 1; step <= 5; ++step) {
        first.addScalar("train/loss", step, 1.0f / static_cast<float>(step));
        first.addScalar("train/lr", step, 2.5e-6f * static_cast<float>(step));
        if (step % 2 == 0) first.addScalar("validation/loss", step, 0.5f * static_cast<float>(step));
      }
    }
    {
      dgemma::TensorBoardWriter resumed = dgemma::TensorBoardWriter::open(argv[1], {.resumedStep = 3, .hostname = "fixture"});
      for (int step = 4; step <= 6; ++step) {
        resumed.addScalar("train/loss", step, 10.0f + static_cast<float>(step));
        resumed.addScalar("train/lr", step, 2.5e-6f * static_cast<float>(step));
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
  return 0;
}
