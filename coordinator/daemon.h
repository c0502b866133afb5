// The coordinator daemon: binds the run's protocol engine (RoundEngine, or
// FedBuffEngine for a fedbuff run) to a ZeroMQ ROUTER socket.
#ifndef COHORT_COORDINATOR_DAEMON_H_
#define COHORT_COORDINATOR_DAEMON_H_

#include <atomic>
#include <string>

#include "common/status.h"
#include "net/connection_guard.h"
#include "net/metrics_endpoint.h"
#include "proto/config.pb.h"

namespace cohort::coordinator {

struct DaemonOptions {
  config::RunConfig config;
  std::string run_dir;  // Holds run.db; created if missing.
  std::string bind = "tcp://127.0.0.1:7000";
  // After binding, the resolved endpoint is written here (atomically) so
  // scripts and tests can find a port chosen by the OS ("tcp://...:0").
  std::string endpoint_file;
  // Transport security (ZeroMQ CURVE). The coordinator's identity key file,
  // and a directory of client .pub files it admits (ZAP). `insecure`: no
  // CURVE at all (plaintext, anyone may join) for local development.
  std::string identity;
  std::string allowlist;
  bool insecure = false;
  // When set (SIGHUP; not owned, may be null), the daemon clears it and
  // reads `allowlist` again: a key no longer in it is revoked at once. New
  // connections with it are refused; a client connected under it is sent
  // a Reject, leaves the round in progress as a dropout, and every further
  // message on its connection is refused. A list that does not load is
  // logged and the old one stays.
  std::atomic<bool>* reload = nullptr;
  // Transport limits. A connection must finish its handshake (CURVE and the
  // allowlist check) within `handshake_timeout_ms`; at most
  // `max_unauthenticated` connections may be in their handshake at once, and
  // newer ones are dropped (logged, one warning per 10 s). kInvalidArgument
  // unless the timeout is in [100, 600000] and the cap at least 1.
  int handshake_timeout_ms = net::kHandshakeTimeoutMs;
  size_t max_unauthenticated = net::kMaxUnauthenticatedConnections;
  // Debugging: write each securely aggregated round's unmasked sum to
  // DIR/round-N.u32 and the names it holds to DIR/round-N.names
  // (synchronous rounds only: refused with fedbuff).
  std::string dump_sums;
  // A model.external run's initial values (open_run.h): an .npz.
  std::string initial_model;
  // --metrics-addr (not owned; null: none): each round's figures go into
  // its registry as they commit (coordinator/metrics.h).
  net::MetricsEndpoint* metrics = nullptr;
};

// Runs until the configured rounds are committed (OK), `stop` becomes true
// (kCancelled; committed rounds stay committed), or the store fails. Prints
// one line per committed round on stdout.
//
// A fedbuff config runs FedBuffEngine's groups (one line per committed
// version); kInvalidArgument with `dump_sums`. The engine's times run from
// the run's start: the daemon's steady clock, offset so that the engine's
// time at start is its start_time() (protocol_engine.h). A resumed fedbuff
// run re-opens its groups in flight as their members register again; a
// client its schedule names that has not registered rounds.client_timeout_s
// after the start is named and set aside, and the group it was in is
// abandoned (FedBuffEngine::CheckScheduledClients).
Status RunCoordinator(const DaemonOptions& options, const std::atomic<bool>& stop);

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_DAEMON_H_
