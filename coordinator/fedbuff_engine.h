// Buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022) as a
// sans-I/O engine beside RoundEngine (config section fedbuff).
//
// Secure aggregation agrees masks among a fixed set of clients before any
// of them masks, so a buffer cannot be filled by whoever happens to finish.
// Instead, the clients are put into groups as they become free: whenever
// fewer than fedbuff.concurrency / buffer_size groups are in flight and
// buffer_size clients are free, the first of them (in the order they became
// free) form a group, which gets the current model version. A group is one
// ordinary round of RoundEngine, with its own in-memory store: its tasks,
// its SecAgg+ session (stragglers still training at its deadline are
// dropouts of it), its sum and mean. Groups overlap in time; when one
// closes, its mean is folded into the global model weighed by its staleness
// (the versions applied since its model was sent) through the configured
// server step (FedBuffStrategy), the version is committed to the run's
// store as the next round, and its clients are free again.
//
// Inside a group the configured per-round rules apply unchanged (FedNova's
// normalised mean, a plain run's robust rule); the group's own server step
// is plain FedAvg at learning rate 1, so its model minus the model it
// started from is its mean.
//
// Resume: each version commits, in the same store transaction as its model
// and server state, the schedule (store::Checkpoint::schedule, a
// checkpoint.FedBuffSchedule): the virtual time of the commit, the free
// clients in their order, the next group number and every group in flight
// (number, members, base version and model, opening time). A restarted
// engine's clock starts at the earliest of those openings (start_time());
// it re-opens each group at its opening time from its base model, with
// the same number (so the same seeds), and opens no new group before the
// commit's time and the groups that were due to close at that instant have
// closed again. The groups re-run as they ran, so the resumed run retraces
// the uninterrupted one bit for bit. A store written without a schedule
// resumes as before: every client free, groups formed anew.
#ifndef COHORT_COORDINATOR_FEDBUFF_ENGINE_H_
#define COHORT_COORDINATOR_FEDBUFF_ENGINE_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/env.h"
#include "coordinator/protocol_engine.h"
#include "coordinator/round_engine.h"
#include "coordinator/strategy.h"
#include "coordinator/strategy_fedbuff.h"
#include "proto/config.pb.h"
#include "store/run_store.h"

namespace cohort::coordinator {

class FedBuffEngine final : public ProtocolEngine {
 public:
  // As RoundEngine::Create: opens the run in `store` (created from
  // `init_model`, or resumed after its last committed version). `config`
  // must have a fedbuff section (kInvalidArgument otherwise).
  static StatusOr<std::unique_ptr<FedBuffEngine>> Create(
      const config::RunConfig& config, std::vector<float> init_model, store::RunStore* store,
      Evaluator evaluator, std::string code_version, Env* env = Env::Default());

  // ProtocolEngine. A client's messages go to its group's engine; Hello,
  // heartbeats and the messages of a client in no group are answered here.
  std::vector<Outgoing> OnMessage(const std::string& peer, const net::Envelope& envelope,
                                  TimeMs now, const AuthenticatedPeer* sender) override;
  std::vector<Outgoing> OnTick(TimeMs now) override;
  std::vector<Outgoing> OnMalformed(const std::string& peer, const Status& why) override;
  // A member of a group in flight leaves it through its engine's Revoke; a
  // free one leaves the free list. Either is drawn again only after a new
  // Hello (a daemon admits one only under a key the allowlist holds again).
  std::vector<Outgoing> Revoke(const std::string& name, const std::string& why,
                               TimeMs now) override;
  std::optional<TimeMs> NextWakeup() const override;
  bool done() const override { return done_; }
  uint32_t last_committed_round() const override { return version_; }
  std::vector<store::RoundRecord> TakeCommitted() override { return std::exchange(committed_, {}); }
  const Status& store_error() const override { return store_error_; }
  TimeMs start_time() const override { return start_time_; }
  bool all_acknowledged_finish(TimeMs now) const override {
    return clients_.AllAcknowledgedFinish(now);
  }
  // A FedBuff run ends at rounds.num_rounds versions only.
  const std::string& finish_reason() const override { return finish_reason_; }
  // The largest limits of the groups in flight (a secure stage's messages
  // grow with the group), or between groups those of the last one opened.
  net::Limits limits() const override;
  size_t num_params() const override { return global_.size(); }

  // For a driver whose clients register over real time (the coordinator
  // daemon), not all at its start as the simulator's do: a resumed run
  // waits `grace` after start_time() for the clients its schedule names;
  // one still missing then is set aside (CheckScheduledClients). 0 (the
  // default): the first tick checks, and a missing client stops the run.
  void set_registration_grace(TimeMs grace) { registration_grace_ = grace; }

  std::span<const float> global_model() const { return global_; }
  size_t groups_in_flight() const { return groups_.size(); }
  // The clients drawn into the next groups, in order.
  const std::deque<std::string>& free_clients() const { return free_; }

 private:
  // A registered client: where it is, the Hello to replay to each group's
  // engine, and the group it trains in (0: free).
  struct Member {
    std::string peer;
    net::Envelope hello;
    std::optional<AuthenticatedPeer> sender;
    uint64_t group = 0;
    bool revoked = false;  // Revoke(): drawn into no group until it says Hello again.
    // Free, but silent past rounds.client_timeout_s: drawn into no group
    // until it speaks again (then it is free once more, last in line).
    bool silent = false;
  };
  struct Group {
    uint64_t id = 0;
    uint32_t base_version = 0;
    std::vector<float> base;  // The model its clients were sent.
    std::vector<std::string> members;
    TimeMs opened_at = 0;
    // A restored group that was done at the commit's instant (re-run, it
    // closes again at that time before new groups open).
    bool closes_at_commit = false;
    std::unique_ptr<store::RunStore> store;
    std::unique_ptr<RoundEngine> engine;  // Null until (re-)opened.
  };

  FedBuffEngine(const config::RunConfig& config, store::RunStore* store, Env* env);
  // Creates the run in the store or resumes it (the strategy's state too).
  Status OpenStore(std::vector<float> init_model, std::string code_version, bool evaluates);

  void OnHello(const std::string& peer, const net::Envelope& envelope, TimeMs now,
               const AuthenticatedPeer* sender, std::vector<Outgoing>& out);
  // Routes `envelope` from `name` to its group's engine, or answers it.
  void Route(const std::string& name, const std::string& peer, const net::Envelope& envelope,
             TimeMs now, std::vector<Outgoing>& out);
  // A group engine's messages to clients, less those this engine speaks for
  // (Welcome, Finished).
  static void Forward(std::vector<Outgoing> from_group, std::vector<Outgoing>& out);
  // Opens groups while fewer than concurrency / buffer_size are in flight
  // and buffer_size clients are free.
  void MaybeOpenGroups(TimeMs now, std::vector<Outgoing>& out);
  // Takes the free clients the registry has timed out off the free list
  // (Member::silent), so that a dead client is drawn into no group.
  void SetAsideSilent(TimeMs now);
  // A silent member that spoke again (at Seen) is free once more.
  void WelcomeBack(const std::string& name);
  // Whether `name` is a member of a restored group still to re-open.
  bool Reopening(const std::string& name) const;
  // Neither revoked nor banned: may be drawn into a group.
  bool Drawable(const std::string& name) const;
  Status OpenGroup(TimeMs now, std::vector<Outgoing>& out);
  // Gives g (id, base, sorted members set) its store and engine at `now`
  // and registers its members there.
  Status StartGroup(Group g, TimeMs now, std::vector<Outgoing>& out);
  // The committed schedule in `cp`, checked (kDataLoss naming the version
  // and what is wrong), into the resume state below.
  Status RestoreSchedule(const store::Checkpoint& cp);
  // The schedule committed with `version` at `now`, as group g closes.
  std::string SaveSchedule(const Group& g, uint32_t version, TimeMs now) const;
  // While resuming: re-opens the restored groups due by `now`; true once
  // the schedule has caught up (new groups may open).
  bool CatchUp(TimeMs now, std::vector<Outgoing>& out);
  // While resuming, once the registrations are in (or the grace is over):
  // a client the schedule names that has not registered stops the run
  // when there is no grace (the simulator's clients changed); with a grace
  // (a daemon's client is down) the run goes on without it, and the group
  // in flight it was in, if any, is abandoned, its other members freed.
  void CheckScheduledClients();
  // The config of group `id`'s engine: one round of buffer_size clients,
  // its server step FedAvg at learning rate 1.
  config::RunConfig GroupConfig(uint64_t id) const;
  // Closes the groups whose engines are done, or wait for members that
  // stopped answering (RoundEngine::AwaitedAbsentClients); then opens what
  // that allows.
  void CloseDoneGroups(TimeMs now, std::vector<Outgoing>& out);
  // Folds group `g` in if it committed, and frees its clients but the
  // `absent` ones, which wait until they speak again.
  void CloseGroup(Group& g, const std::vector<std::string>& absent, TimeMs now);
  // After a group closes: `committed` whether it made a version, else
  // `why` not. kMaxGroupsWithoutVersion in a row stop the run (store_error_)
  // naming the last reason: groups that all abort (a deadline shorter than
  // training) would otherwise be drawn forever, as no version ever ends it.
  void CountGroupsWithoutAVersion(bool committed, const std::string& why);
  // Folds group `g`'s mean into the global model and commits the version.
  Status ApplyGroup(Group& g, const store::RoundRecord& group_record, TimeMs now);
  Status CommitVersion(const Group& g, store::RoundRecord record, uint32_t staleness,
                       const EvalMetrics& metrics, TimeMs now);
  void Finish(std::vector<Outgoing>& out);

  config::RunConfig config_;
  store::RunStore* store_;
  Env* env_;
  std::string run_nonce_;           // store::RunInfo::run_nonce, sent in every Welcome.
  std::unique_ptr<Env> group_env_;  // The groups' engines log warnings only.
  std::unique_ptr<Strategy> strategy_;
  FedBuffStrategy* fedbuff_ = nullptr;  // Inside strategy_.
  std::vector<float> global_;
  uint32_t version_ = 0;  // Last committed.
  bool done_ = false;
  ClientRegistry clients_;
  std::map<std::string, Member> members_;  // By name.
  std::deque<std::string> free_;           // In the order they became free.
  // Proven to misbehave in a group (its engine's ban), with why: drawn into
  // no later group; kept in the schedule.
  std::map<std::string, std::string> banned_;
  std::map<uint64_t, Group> groups_;  // In flight, by id.
  uint64_t next_group_ = 1;
  static constexpr uint32_t kMaxGroupsWithoutVersion = 50;
  uint32_t groups_without_version_ = 0;  // Closed in a row since the last version.
  std::vector<store::RoundRecord> committed_;
  Status store_error_;
  // Resuming a committed schedule: the groups still to re-open (by opening
  // time), the commit's time (unset once caught up), whether a tick at or
  // after it came, and every client the schedule names.
  std::deque<Group> to_reopen_;
  std::optional<TimeMs> resume_at_;
  bool resume_ticked_ = false;
  std::set<std::string> scheduled_;
  TimeMs start_time_ = 0;
  TimeMs registration_grace_ = 0;
  net::Limits idle_limits_;          // A group engine's between its rounds.
  const std::string finish_reason_;  // Always empty.
};

}  // namespace cohort::coordinator

#endif  // COHORT_COORDINATOR_FEDBUFF_ENGINE_H_
