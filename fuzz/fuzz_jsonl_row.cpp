// libFuzzer target: a JSONL file of training rows (docs/data.md, "JSONL rows", "Row validation"),
// read the way check-data and train read it: line splitting (CRLF, BOM, blank and over-long lines)
// and every row's schema. Skip mode, so one input exercises every line of it.
#include <cstdint>

#include "fuzz/FuzzSupport.h"
#include "runtime/data/rows/Rows.h"

namespace {

// The parser under test. Lines are capped at 4 KiB (the default is 64 MiB) so that the over-long-line
// path is reachable by small inputs.
void parseJsonl(std::string_view bytes) {
  const std::string path = dgemma::fuzz::writeScratchFile("rows.jsonl", bytes);
  dgemma::JsonlReaderOptions options;
  options.maxLineBytes = 4096;
  dgemma::RowScan scan = dgemma::readRows(path, /*skipBadRows=*/true, options);
  (void)dgemma::skippedRowsReport(scan);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), parseJsonl);
  return 0;
}
