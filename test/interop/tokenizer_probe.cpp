// The C++ half of the tokenizer parity test (tokenizer_parity_interop.py; docs/data.md,
// "Tokenization"): loads a tokenizer directory with dgemma::Tokenizer and tokenizes a corpus.
//   dgemma_tokenizer_probe TOKENIZER_DIR CORPUS
// CORPUS holds records as "LENGTH\n" + LENGTH bytes + "\n" (test/interop/tokenizer_corpus.py). The
// output is the backend's name on the first line, then per record two lines: encode()'s ids,
// separated by spaces, and decode() of those ids in hex.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "support/InputFile.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: dgemma_tokenizer_probe TOKENIZER_DIR CORPUS\n";
    return 2;
  }
  try {
    const dgemma::Tokenizer tokenizer(argv[1]);
    const std::string corpus = dgemma::readRegularFile(argv[2]);
    std::string out = tokenizer.backend() + "\n";
    for (size_t pos = 0; pos < corpus.size();) {
      const size_t newline = corpus.find('\n', pos);
      const size_t length = std::stoull(corpus.substr(pos, newline - pos));
      const std::vector<int32_t> ids = tokenizer.encode(std::string_view(corpus).substr(newline + 1, length));
      pos = newline + 1 + length + 1;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) out += ' ';
        out += std::to_string(ids[i]);
      }
      out += '\n';
      const std::vector<int64_t> wide(ids.begin(), ids.end());
      for (unsigned char c : tokenizer.decode(wide)) {
        char hex[3];
        std::snprintf(hex, sizeof hex, "%02x", c);
        out += hex;
      }
      out += '\n';
    }
    std::cout << out;
  } catch (const std::exception& e) {
    std::cerr << "dgemma_tokenizer_probe: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
