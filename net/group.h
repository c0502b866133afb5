// Joining a group of ranks: the rendezvous, then the data transport every
// collective of the group runs over. Used by data-parallel workers and by
// the workers of a site (a federated client that is data-parallel inside).
#ifndef COHORT_NET_GROUP_H_
#define COHORT_NET_GROUP_H_

#include <memory>
#include <string>
#include <zmq.hpp>

#include "collective/collective.h"
#include "collective/transport.h"
#include "common/status.h"
#include "crypto/key_files.h"
#include "crypto/keys.h"
#include "net/join.h"

namespace cohort::net {

struct GroupOptions {
  int rank = 0, size = 1;
  // Rank 0's rendezvous address: tcp://HOST:PORT, or ipc://PATH on one host.
  std::string master;
  // shm (shared memory: every rank on this host), tcp, mpi (ranks started
  // by mpirun; no rendezvous), or auto: shm with an ipc:// master, tcp
  // otherwise.
  std::string transport = "auto";
  std::string host = "127.0.0.1";  // Where other ranks reach this one (tcp).
  // Authentication between ranks over tcp: this rank's identity, the keys
  // that may join (the files of an --allow directory, this rank's among
  // them) and rank 0's public key. The rendezvous runs over ZeroMQ CURVE; a
  // rank then hears only from the ranks it met there, each under its own
  // key. `encrypt`: the data moves over ZeroMQ CURVE too (encrypted);
  // otherwise over TcpTransport, whose connections prove the pair's key
  // but carry plaintext (trusted fabrics, faster). Without an identity
  // nothing is authenticated, and JoinGroup refuses that unless `insecure`.
  const crypto::Ed25519KeyPair* identity = nullptr;
  std::vector<crypto::AllowedKey> allowlist{};
  crypto::Ed25519Public master_key{};
  bool encrypt = true;
  bool insecure = false;
};

bool UsesSharedMemory(const GroupOptions& options);

// A rank's keys from files (`cohort worker`, `cohort site-worker`): its
// identity key file, the allowlist directory and rank 0's .pub file, all
// three or none (then nothing is loaded). The key pair goes to `*identity`,
// which must outlive the group; `who` names the command in errors.
Status LoadGroupKeys(const std::string& identity_file, const std::string& allow_dir,
                     const std::string& master_key_file, const std::string& who,
                     crypto::Ed25519KeyPair* identity, GroupOptions* options);
// How the group's data travels, for logs: "shared memory", "tcp, ZeroMQ
// CURVE: authenticated and encrypted", "tcp: authenticated, not encrypted"
// or "tcp: plaintext, not authenticated".
std::string Describe(const GroupOptions& options);

// The first IPv4 address `host` (a name or a dotted quad) resolves to, as a
// dotted quad. kNotFound naming the host when it has none.
StatusOr<std::string> ResolveIpv4(const std::string& host);

// This rank's transport, connected to every peer once all have met at the
// master (waiting up to `collective.timeout_ms`): the join registered under
// options.transport (net/join.h; "auto": shm with an ipc:// master, tcp
// otherwise). A host name in options.host or a tcp:// master ("gpu03", as
// Slurm's node list gives it) stands for its first IPv4 address.
StatusOr<std::unique_ptr<collective::Transport>> JoinGroup(
    zmq::context_t& context, const GroupOptions& options,
    const collective::CollectiveOptions& collective);

}  // namespace cohort::net

#endif  // COHORT_NET_GROUP_H_
