#include "net/endpoint.h"

namespace cohort::net {

Status CheckEndpoint(const std::string& flag, const std::string& endpoint) {
  for (const char* scheme : {"tcp://", "ipc://", "inproc://"}) {
    const std::string s = scheme;
    if (endpoint.rfind(s, 0) == 0) {
      if (endpoint.size() == s.size()) {
        return InvalidArgumentError(flag + " " + endpoint + ": the address after " + s +
                                    " is missing");
      }
      if (s == "tcp://" && endpoint.find(':', s.size()) == std::string::npos) {
        return InvalidArgumentError(flag + " " + endpoint +
                                    ": a tcp endpoint needs a port (tcp://HOST:PORT; port 0 "
                                    "picks a free one)");
      }
      return OkStatus();
    }
  }
  std::string hint;
  if (endpoint.find("://") == std::string::npos && endpoint.find(':') != std::string::npos) {
    hint = "; did you mean tcp://" + endpoint + "?";
  }
  return InvalidArgumentError(flag + " " + endpoint +
                              ": not an endpoint (write tcp://HOST:PORT or ipc://PATH)" + hint);
}

}  // namespace cohort::net
