// Which address this host reaches a peer from: what a rank on another host than MASTER_ADDR binds
// Gloo's transport to and advertises, so that its peers connect to a routable address, not
// loopback.
#pragma once

#include <string>

namespace dgemma {

// The address of the interface the routing table sends packets to `host` through ("10.0.0.5";
// "127.0.0.1" for a loopback `host`). Found by connecting a UDP socket, which sends nothing, and
// reading its local address. RuntimeError naming `host` when it does not resolve or is unreachable.
std::string localAddressTowards(const std::string& host);

}  // namespace dgemma
