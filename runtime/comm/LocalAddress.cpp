#include "runtime/comm/LocalAddress.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "support/Error.h"

namespace dgemma {

std::string localAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* addresses = nullptr;
  // Any port does: connecting a UDP socket only picks the route.
  int status = ::getaddrinfo(host.c_str(), "9", &hints, &addresses);
  if (status != 0) throw RuntimeError("MASTER_ADDR " + host + ": cannot resolve: " + ::gai_strerror(status));
  std::string problem = "no address";
  for (addrinfo* address = addresses; address; address = address->ai_next) {
    int probe = ::socket(address->ai_family, SOCK_DGRAM, 0);
    if (probe < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::connect(probe, address->ai_addr, address->ai_addrlen) != 0 ||
        ::getsockname(probe, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
      problem = std::strerror(errno);
      ::close(probe);
      continue;
    }
    ::close(probe);
    ::freeaddrinfo(addresses);
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    ::inet_ntop(local.ss_family, raw, text, sizeof text);
    return text;
  }
  ::freeaddrinfo(addresses);
  throw RuntimeError("MASTER_ADDR " + host + ": no route to it: " + problem);
}

}  // namespace dgemma
