// The C++ half of the TCP store interop test (tcp_store_interop.py): dgemma's TcpStore client
// against torch's c10d TCPStore server, and torch's client against dgemma's TcpStoreServer.
//   dgemma_tcp_store_probe client HOST PORT   sets probe/from-dgemma, reads probe/from-torch, adds 5
//                                             to probe/counter; prints what it read
//   dgemma_tcp_store_probe serve PORT_FILE    serves one client; writes the port to PORT_FILE first
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>

#include "runtime/comm/TcpStore.h"

namespace {

using namespace std::chrono_literals;

int runClient(const std::string& host, int port) {
  dgemma::TcpStore store(host, port, 20s);
  const std::string sent = "alpha";
  store.set("probe/from-dgemma", std::vector<char>(sent.begin(), sent.end()));
  const std::vector<char> read = store.get("probe/from-torch");
  std::cout << "read " << std::string(read.begin(), read.end()) << "\n";
  std::cout << "sum " << store.add("probe/counter", 5) << "\n";
  try {
    store.wait({"probe/never-set"}, 200ms);
    std::cout << "waited for a key nobody set\n";
    return 1;
  } catch (const std::exception&) {
    std::cout << "missing key timed out\n";
  }
  return 0;
}

int runServer(const std::string& portFile) {
  dgemma::TcpStoreServer server(0, 1, 60s);
  {
    std::ofstream out(portFile + ".tmp");
    out << server.port() << "\n";
  }
  std::rename((portFile + ".tmp").c_str(), portFile.c_str());
  return 0;  // the destructor serves until the one client has come and gone
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "client" && argc == 4) return runClient(argv[2], std::stoi(argv[3]));
    if (mode == "serve" && argc == 3) return runServer(argv[2]);
  } catch (const std::exception& error) {
    std::cerr << "dgemma_tcp_store_probe: " << error.what() << "\n";
    return 1;
  }
  std::cerr << "usage: dgemma_tcp_store_probe client HOST PORT | serve PORT_FILE\n";
  return 2;
}
