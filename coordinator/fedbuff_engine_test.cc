// FedBuffEngine's resume from a committed schedule: a schedule that does
// not hold together is refused at start, naming the version and what is
// wrong, and the store keeps its committed versions.
#include "coordinator/fedbuff_engine.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "proto/checkpoint.pb.h"

namespace cohort::coordinator {
namespace {

constexpr size_t kParams = 10;  // logreg 4 -> 2.

config::RunConfig Config() {
  config::RunConfig c;
  c.set_seed(11);
  c.mutable_model()->set_arch("logreg");
  c.mutable_model()->set_input_dim(4);
  c.mutable_model()->set_num_classes(2);
  c.mutable_rounds()->set_num_rounds(5);
  c.mutable_rounds()->set_min_clients(2);
  c.mutable_rounds()->set_round_deadline_s(10);
  c.mutable_rounds()->set_client_timeout_s(100);
  c.mutable_secagg()->set_aggregation(config::PLAIN);
  c.mutable_fedbuff()->set_buffer_size(2);
  c.mutable_fedbuff()->set_concurrency(4);
  return c;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Version 1 committed at 5 s: c4, c5 free, group 2 (c0, c1, from version
// 1) and group 1 (c2, c3, from version 0) in flight.
checkpoint::FedBuffSchedule ValidSchedule() {
  checkpoint::FedBuffSchedule s;
  s.set_version(1);
  s.set_clock_ms(5000);
  s.set_next_group(3);
  s.add_free("c4");
  s.add_free("c5");
  for (const auto& [id, base, opened, a, b] :
       {std::tuple{2u, 1u, 5000, "c0", "c1"}, std::tuple{1u, 0u, 1000, "c2", "c3"}}) {
    checkpoint::FedBuffGroup& g = *s.add_groups();
    g.set_id(id);
    g.set_base_version(base);
    g.set_opened_ms(opened);
    g.add_members(a);
    g.add_members(b);
    g.set_base_model(Bytes(std::vector<float>(kParams, 0.5f * static_cast<float>(base))));
  }
  return s;
}

// A store with version 1 committed with `schedule` (serialized as is).
std::unique_ptr<store::RunStore> StoreWith(const std::string& schedule,
                                           const config::RunConfig& config = Config()) {
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto created = FedBuffEngine::Create(config, std::vector<float>(kParams, 0.0f), store.get(),
                                       Evaluator(), "test");
  EXPECT_TRUE(created.ok()) << created.status();
  store::RoundRecord r;
  r.round = 1;
  store::Checkpoint cp{1, std::vector<float>(kParams, 0.5f), {}};
  cp.schedule = schedule;
  EXPECT_TRUE(store->CommitRound(r, {}, cp, 3).ok());
  return store;
}

TEST(FedBuffResumeScheduleTest, AValidScheduleResumesAtItsEarliestGroup) {
  auto store = StoreWith(ValidSchedule().SerializeAsString());
  auto engine = FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test");
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->last_committed_round(), 1u);
  EXPECT_EQ((*engine)->start_time(), 1000);  // Group 1's opening.
  EXPECT_EQ((*engine)->NextWakeup(), std::optional<TimeMs>(1000));
  EXPECT_EQ((*engine)->groups_in_flight(), 0u);  // Until its members register.
}

struct Broken {
  std::string name;
  std::function<void(checkpoint::FedBuffSchedule&)> change;
  std::string message;
};

void PrintTo(const Broken& b, std::ostream* os) { *os << b.name; }

class BrokenScheduleTest : public ::testing::TestWithParam<Broken> {};

TEST_P(BrokenScheduleTest, IsDataLossNamingWhatIsWrongAndKeepsTheVersions) {
  checkpoint::FedBuffSchedule s = ValidSchedule();
  GetParam().change(s);
  auto store = StoreWith(s.SerializeAsString());
  auto engine = FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test");
  ASSERT_FALSE(engine.ok()) << "a broken schedule was resumed";
  EXPECT_EQ(engine.status().code(), StatusCode::kDataLoss) << engine.status();
  EXPECT_EQ(engine.status().message(),
            "fedbuff: the schedule committed with version 1" + GetParam().message);
  EXPECT_EQ(std::move(store->Rounds()).value().size(), 1u);
  EXPECT_EQ(std::move(store->LatestCheckpoint()).value().model, std::vector<float>(kParams, 0.5f));
}

INSTANTIATE_TEST_SUITE_P(
    Checks, BrokenScheduleTest,
    ::testing::Values(
        Broken{"Version", [](auto& s) { s.set_version(2); }, " names version 2"},
        Broken{"Clock", [](auto& s) { s.set_clock_ms(-1); }, " has a negative virtual time"},
        Broken{"FreeTwice", [](auto& s) { s.add_free("c4"); },
               ": client c4 is in the schedule twice"},
        Broken{"FreeAndInAGroup", [](auto& s) { s.add_free("c0"); },
               ": client c0 is in the schedule twice"},
        Broken{"GroupNumber", [](auto& s) { s.set_next_group(2); },
               ": group 2 is not numbered below the next group, 2"},
        Broken{"GroupZero", [](auto& s) { s.mutable_groups(0)->set_id(0); },
               ": group 0 is not numbered below the next group, 3"},
        Broken{"BaseAfterCommit", [](auto& s) { s.mutable_groups(0)->set_base_version(2); },
               ": group 2 was sent version 2, after the commit"},
        Broken{"OpenedAfterCommit", [](auto& s) { s.mutable_groups(0)->set_opened_ms(5001); },
               ": group 2 opened at 5001 ms, outside [0, 5000]"},
        Broken{"OpenedBeforeZero", [](auto& s) { s.mutable_groups(1)->set_opened_ms(-3); },
               ": group 1 opened at -3 ms, outside [0, 5000]"},
        Broken{"Members", [](auto& s) { s.mutable_groups(1)->add_members("c9"); },
               ": group 1 has 3 members, fedbuff.buffer_size is 2"},
        Broken{"BaseModel", [](auto& s) { s.mutable_groups(1)->mutable_base_model()->resize(38); },
               ": group 1: its base model has 38 bytes, the model 40"},
        Broken{"GroupTwice", [](auto& s) { s.mutable_groups(1)->set_id(2); },
               ": group 2 is in the schedule twice"}),
    [](const auto& info) { return info.param.name; });

TEST(FedBuffResumeScheduleTest, AScheduleThatDoesNotParseIsNamed) {
  auto store = StoreWith(std::string("\xff\xff\xff", 3));
  auto engine = FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test");
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(engine.status().message(),
            "fedbuff: the schedule committed with version 1 does not parse");
}

net::Envelope Hello(const std::string& name) {
  net::Envelope e;
  e.header.set_version(wire::VERSION_1);
  e.header.mutable_hello()->set_client_name(name);
  e.header.mutable_hello()->set_num_samples(100);
  return e;
}

// As RoundEngine's: the Welcome's run nonce is drawn with the run and sent
// again after a resume (client/dp_ledger.h tells runs apart by it).
TEST(FedBuffEngineTest, TheRunNonceIsKeptAcrossAResume) {
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto nonce_sent = [&](const std::string& name) {
    auto engine = std::move(FedBuffEngine::Create(Config(), std::vector<float>(kParams, 0.0f),
                                                  store.get(), Evaluator(), "test"))
                      .value();
    auto out = engine->OnMessage(name, Hello(name), 1000, nullptr);
    return !out.empty() && out[0].header.has_welcome() ? out[0].header.welcome().run_nonce()
                                                       : std::string("(no welcome)");
  };
  const std::string nonce = nonce_sent("c0");
  EXPECT_EQ(nonce.size(), 32u);
  EXPECT_EQ(store->LoadRun().value()->run_nonce, nonce);
  EXPECT_EQ(nonce_sent("c1"), nonce);
}

// Version 1 committed at 5 s with c4, c5 free and group 1 (c2, c3, opened
// at 1 s) in flight; `closing`: group 1 was done at that instant, to be
// folded in as version 2 in the same pass.
std::unique_ptr<store::RunStore> StoreClosingAtCommit(bool closing) {
  checkpoint::FedBuffSchedule s;
  s.set_version(1);
  s.set_clock_ms(5000);
  s.set_next_group(2);
  s.add_free("c4");
  s.add_free("c5");
  checkpoint::FedBuffGroup& g = *s.add_groups();
  g.set_id(1);
  g.set_opened_ms(1000);
  g.add_members("c2");
  g.add_members("c3");
  g.set_closes_at_commit(closing);
  g.set_base_model(Bytes(std::vector<float>(kParams, 0.0f)));
  return StoreWith(s.SerializeAsString());
}

// The restored group re-opens at its time once its members are back; no
// new group opens before the commit's time, nor, when a group was done at
// that instant, before that group has closed again (in the uninterrupted
// run its members were free before the next groups formed).
TEST(FedBuffResumeScheduleTest, NewGroupsWaitForTheGroupsDoneAtTheCommit) {
  for (const bool closing : {false, true}) {
    auto store = StoreClosingAtCommit(closing);
    auto engine =
        std::move(FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test")).value();
    EXPECT_EQ(engine->start_time(), 1000);
    for (const char* name : {"c2", "c3", "c4", "c5"})
      (void)engine->OnMessage(name, Hello(name), 1000, nullptr);
    EXPECT_EQ(engine->groups_in_flight(), 1u) << "group 1 did not re-open at its time";
    (void)engine->OnTick(4999);
    EXPECT_EQ(engine->groups_in_flight(), 1u) << "a group opened before the commit's time";
    (void)engine->OnTick(5000);
    EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
    EXPECT_EQ(engine->groups_in_flight(), closing ? 1u : 2u) << "closing: " << closing;
  }
}

// With no group in flight at the commit the clock starts at the commit,
// and the first groups form, once every client is back, from the free
// clients in their stored order, not in the order they register again.
TEST(FedBuffResumeScheduleTest, GroupsFormFromTheStoredFreeOrderOnceAllAreBack) {
  checkpoint::FedBuffSchedule s;
  s.set_version(1);
  s.set_clock_ms(5000);
  s.set_next_group(2);
  for (const char* name : {"c3", "c1", "c2", "c0"}) s.add_free(name);
  auto store = StoreWith(s.SerializeAsString());
  auto engine =
      std::move(FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test")).value();
  EXPECT_EQ(engine->start_time(), 5000);
  std::vector<std::string> tasked;
  for (const char* name : {"c0", "c1", "c2", "c3"}) {
    EXPECT_EQ(engine->groups_in_flight(), 0u) << "a group opened before " << name << " was back";
    for (const Outgoing& o : engine->OnMessage(name, Hello(name), 5000, nullptr)) {
      if (o.header.has_task()) tasked.push_back(o.peer);
    }
  }
  EXPECT_EQ(engine->groups_in_flight(), 2u);
  ASSERT_EQ(tasked.size(), 4u);
  EXPECT_EQ(std::set<std::string>(tasked.begin(), tasked.begin() + 2),
            (std::set<std::string>{"c1", "c3"}));
}

// While a resume catches up (no group drawn yet), a client silent past
// the timeout is still expired at the tick NextWakeup asked for: a driver
// that ticks at each wakeup (the simulator) moves on instead of waking at
// the same instant forever.
TEST(FedBuffResumeScheduleTest, ATimeoutWhileCatchingUpDoesNotWakeTheDriverForever) {
  config::RunConfig config = Config();
  config.mutable_rounds()->set_client_timeout_s(3);  // Timed out at 4 s, before the 5 s commit.
  auto store = StoreWith(ValidSchedule().SerializeAsString(), config);
  auto created = FedBuffEngine::Create(config, {}, store.get(), Evaluator(), "test");
  ASSERT_TRUE(created.ok()) << created.status();
  auto engine = std::move(created).value();
  for (const char* name : {"c0", "c1", "c2", "c3", "c4", "c5"}) {
    (void)engine->OnMessage(name, Hello(name), 1000, nullptr);
  }
  int ticks = 0;
  for (std::optional<TimeMs> w = engine->NextWakeup(); w && *w < 5000 && ticks < 100; ++ticks) {
    (void)engine->OnTick(*w);
    const std::optional<TimeMs> next = engine->NextWakeup();
    ASSERT_TRUE(!next || *next > *w) << "woken at " << *w << " again";
    w = next;
  }
  EXPECT_LT(ticks, 100);
}

// A client the schedule names that does not register is an error at the
// driver's first tick, not a stall; every one missing is named.
TEST(FedBuffResumeScheduleTest, AScheduledClientThatNeverRegistersIsNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"c0", "c1", "c2", "c3", "c4"},
       "client c5 of the committed schedule has not registered (the run's clients changed, or "
       "it is offline)"},
      {{"c1", "c4"},
       "clients c0, c2, c3, c5 of the committed schedule have not registered (the run's clients "
       "changed, or they are offline)"},
      {{}, "clients c0, c1, c2, c3, c4 and 1 more of the committed schedule have not registered"}};
  for (const auto& [back, names] : cases) {
    auto store = StoreWith(ValidSchedule().SerializeAsString());
    auto engine =
        std::move(FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test")).value();
    for (const std::string& name : back) (void)engine->OnMessage(name, Hello(name), 500, nullptr);
    (void)engine->OnTick(1000);
    EXPECT_EQ(engine->store_error().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(engine->store_error().message().find("fedbuff: resuming after version 1: " + names),
              std::string::npos)
        << engine->store_error();
  }
}

// Who got a task in `out`.
std::set<std::string> Tasked(const std::vector<Outgoing>& out) {
  std::set<std::string> peers;
  for (const Outgoing& o : out) {
    if (o.header.has_task()) peers.insert(o.peer);
  }
  return peers;
}

bool Rejected(const std::vector<Outgoing>& out, const std::string& peer) {
  for (const Outgoing& o : out) {
    if (o.peer == peer && o.header.has_reject()) return true;
  }
  return false;
}

// A new run's engine (or a resumed one, on a store that holds versions).
std::unique_ptr<FedBuffEngine> NewEngine(const config::RunConfig& config, store::RunStore* store) {
  return std::move(FedBuffEngine::Create(config, std::vector<float>(kParams, 0.0f), store,
                                         Evaluator(), "test"))
      .value();
}

// Config(), one group at a time, which commits with one update.
config::RunConfig OneGroupAtATime() {
  config::RunConfig config = Config();
  config.mutable_rounds()->set_min_clients(1);
  config.mutable_fedbuff()->set_concurrency(2);
  return config;
}

// c0 and c1 say Hello and form the first group: c0's task.
std::optional<wire::RoundTask> FirstGroup(FedBuffEngine& engine) {
  (void)engine.OnMessage("c0", Hello("c0"), 0, nullptr);
  std::optional<wire::RoundTask> task;
  for (const Outgoing& o : engine.OnMessage("c1", Hello("c1"), 1, nullptr)) {
    if (o.peer == "c0" && o.header.has_task()) task = o.header.task();
  }
  return task;
}

// A plain update of `task`: `delta` in every value, 100 samples.
net::Envelope UpdateFor(const wire::RoundTask& task, float delta) {
  net::Envelope update;
  update.header.set_version(wire::VERSION_1);
  update.header.mutable_update()->set_round(task.round());
  update.header.mutable_update()->set_task_id(task.task_id());
  update.header.mutable_update()->set_num_samples(100);
  update.payloads.push_back(std::vector<float>(kParams, delta));
  return update;
}

// A revoked client (the daemon's SIGHUP) is sent a Reject and drawn into no
// group until it says Hello again; a member of a group in flight is
// rejected through its group's engine; the limits grow with a group's
// payloads.
TEST(FedBuffEngineTest, ARevokedClientIsDrawnIntoNoGroup) {
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto engine = std::move(FedBuffEngine::Create(Config(), std::vector<float>(kParams, 0.0f),
                                                store.get(), Evaluator(), "test"))
                    .value();
  EXPECT_EQ(engine->limits().max_payload_floats, 0u) << "no group yet: no payload is due";
  (void)engine->OnMessage("c0", Hello("c0"), 0, nullptr);
  EXPECT_TRUE(Rejected(engine->Revoke("c0", "key revoked", 1), "c0"));
  EXPECT_TRUE(engine->Revoke("nobody", "key revoked", 1).empty());
  std::set<std::string> tasked;
  for (const char* name : {"c1", "c2", "c3"}) {
    for (const std::string& peer : Tasked(engine->OnMessage(name, Hello(name), 2, nullptr)))
      tasked.insert(peer);
  }
  EXPECT_EQ(tasked, (std::set<std::string>{"c1", "c2"})) << "c0 was drawn after its revocation";
  EXPECT_GE(engine->limits().max_payload_floats, kParams);
  // A new Hello (its key allowed again) makes c0 drawable: c3 and c0 form
  // the second group.
  EXPECT_EQ(Tasked(engine->OnMessage("c0", Hello("c0"), 3, nullptr)),
            (std::set<std::string>{"c0", "c3"}));
  // A member of a group in flight is rejected by its group's engine.
  EXPECT_TRUE(Rejected(engine->Revoke("c1", "key revoked", 4), "c1"));
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// A revoked member is not freed when its group closes: the group commits
// without it and the next group is drawn from the others.
TEST(FedBuffEngineTest, ARevokedMemberIsNotFreedWhenItsGroupCloses) {
  const config::RunConfig config = OneGroupAtATime();
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto engine = NewEngine(config, store.get());
  const std::optional<wire::RoundTask> task = FirstGroup(*engine);
  ASSERT_TRUE(task.has_value());
  EXPECT_TRUE(Rejected(engine->Revoke("c1", "key revoked", 2), "c1"));
  const net::Envelope update = UpdateFor(*task, 1.0f);
  EXPECT_TRUE(Tasked(engine->OnMessage("c0", update, 3, nullptr)).empty())
      << "a group opened with the revoked c1";
  EXPECT_EQ(engine->last_committed_round(), 1u);
  EXPECT_EQ(Tasked(engine->OnMessage("c2", Hello("c2"), 4, nullptr)),
            (std::set<std::string>{"c0", "c2"}));
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// The engine's fold, by value: two groups open from version 0; the first
// to finish (mean delta 1) makes version 1 = 0 + 1; the second (mean delta
// 0.5, now one version stale) is weighed by 1 / sqrt(1 + 1): version 2 =
// 1 + 0.5 / sqrt(2). The model and each version's base are what the
// paper's rule gives, not what the engine reports about itself.
TEST(FedBuffEngineTest, EachGroupIsFoldedInWeighedByItsStaleness) {
  config::RunConfig config = Config();
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto engine = NewEngine(config, store.get());
  std::map<std::string, wire::RoundTask> tasks;
  auto hello = [&](const std::string& name, TimeMs now) {
    for (const Outgoing& o : engine->OnMessage(name, Hello(name), now, nullptr)) {
      if (o.header.has_task()) tasks[o.peer] = o.header.task();
    }
  };
  auto send = [&](const std::string& name, float delta, TimeMs now) {
    (void)engine->OnMessage(name, UpdateFor(tasks.at(name), delta), now, nullptr);
  };
  for (const char* name : {"c0", "c1", "c2", "c3"}) hello(name, 0);
  ASSERT_EQ(tasks.size(), 4u);
  send("c2", 1.0f, 10);
  send("c3", 1.0f, 11);
  ASSERT_EQ(engine->last_committed_round(), 1u);
  for (float v : engine->global_model()) EXPECT_FLOAT_EQ(v, 1.0f);
  send("c0", 0.5f, 12);
  send("c1", 0.5f, 13);
  ASSERT_EQ(engine->last_committed_round(), 2u);
  const float want = static_cast<float>(1.0 + 0.5 / std::sqrt(2.0));
  for (float v : engine->global_model()) EXPECT_NEAR(v, want, 1e-6f);
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// A version whose evaluation is not finite is not made, as a synchronous
// round that gives one aborts (StepAndEvaluate is both engines' step): the
// model stays, the run goes on, and the next group makes version 1. (A NaN
// loss used to be committed, where the store refuses it: the run stopped,
// and a resume stopped at the same group again.)
TEST(FedBuffEngineTest, AGroupWhoseNewModelEvaluatesNotFiniteMakesNoVersion) {
  std::ostringstream lines;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(lines);
  spdlog::default_logger_raw()->sinks().push_back(sink);
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  const Evaluator nan_above_one = [](std::span<const float> model) -> StatusOr<EvalMetrics> {
    if (model[0] > 1.5f) return EvalMetrics{std::numeric_limits<double>::quiet_NaN(), 0.5};
    return EvalMetrics{0.25, 0.5};
  };
  auto engine =
      std::move(FedBuffEngine::Create(OneGroupAtATime(), std::vector<float>(kParams, 0.0f),
                                      store.get(), nan_above_one, "test"))
          .value();
  std::map<std::string, wire::RoundTask> tasks;
  auto send = [&](const std::string& name, const net::Envelope& message, TimeMs now) {
    for (const Outgoing& o : engine->OnMessage(name, message, now, nullptr)) {
      if (o.header.has_task()) tasks[o.peer] = o.header.task();
    }
  };
  send("c0", Hello("c0"), 0);
  send("c1", Hello("c1"), 1);
  ASSERT_EQ(tasks.size(), 2u);
  const uint64_t first = tasks.at("c0").task_id();
  send("c0", UpdateFor(tasks.at("c0"), 2.0f), 2);
  send("c1", UpdateFor(tasks.at("c1"), 2.0f), 2);
  EXPECT_EQ(engine->last_committed_round(), 0u);
  for (float v : engine->global_model()) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
  EXPECT_NE(lines.str().find("fedbuff: group 1 not applied: the new model's test loss is not "
                             "finite; the model is unchanged"),
            std::string::npos)
      << lines.str();
  ASSERT_NE(tasks.at("c0").task_id(), first) << "no next group for c0";
  send("c0", UpdateFor(tasks.at("c0"), 1.0f), 3);
  send("c1", UpdateFor(tasks.at("c1"), 1.0f), 3);
  spdlog::default_logger_raw()->sinks().pop_back();
  EXPECT_EQ(engine->last_committed_round(), 1u);
  auto rounds = std::move(store->Rounds()).value();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].test_loss, 0.25);
}

// A plain group whose member stops answering: the one update it has is
// short of rounds.min_clients (2), and a re-run could select only from its
// own members, of which one answers. It would wait for ever, holding c0; it
// closes instead, naming the silent member, c0 is free for the next group,
// and c1 is drawn into none until it speaks again.
TEST(FedBuffEngineTest, AGroupWhoseMemberStoppedAnsweringClosesAndFreesTheOthers) {
  std::ostringstream lines;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(lines);
  spdlog::default_logger_raw()->sinks().push_back(sink);
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  config::RunConfig config = Config();
  config.mutable_fedbuff()->set_concurrency(6);  // Groups of 2, three in flight.
  auto engine = NewEngine(config, store.get());
  std::map<std::string, wire::RoundTask> tasks;
  auto take = [&](const std::vector<Outgoing>& out) {
    std::set<std::string> tasked;
    for (const Outgoing& o : out) {
      if (o.header.has_task()) tasks[o.peer] = o.header.task(), tasked.insert(o.peer);
    }
    return tasked;
  };
  for (const char* name : {"c0", "c1", "c2", "c3"})
    take(engine->OnMessage(name, Hello(name), 0, nullptr));
  ASSERT_EQ(tasks.size(), 4u);
  (void)engine->OnMessage("c0", UpdateFor(tasks.at("c0"), 1.0f), 1000, nullptr);
  // c2 and c3 make version 1 and form the next group at once (its
  // deadline 15 s).
  (void)engine->OnMessage("c2", UpdateFor(tasks.at("c2"), 1.0f), 5000, nullptr);
  EXPECT_EQ(take(engine->OnMessage("c3", UpdateFor(tasks.at("c3"), 1.0f), 5000, nullptr)),
            (std::set<std::string>{"c2", "c3"}));
  ASSERT_EQ(engine->last_committed_round(), 1u);
  // The 10 s deadline passes: c1 is cut, c0's group closes.
  (void)engine->OnTick(11'000);
  EXPECT_EQ(take(engine->OnMessage("c4", Hello("c4"), 12'000, nullptr)),
            (std::set<std::string>{"c0", "c4"}))
      << "c0 is still held by its group";
  spdlog::default_logger_raw()->sinks().pop_back();
  EXPECT_NE(lines.str().find("fedbuff: group 1 (from version 0) closed: its round must run again, "
                             "and fewer of its members answer than rounds.min_clients (2): c1 "
                             "stopped answering; the model is unchanged"),
            std::string::npos)
      << lines.str();
  // Two groups in flight, room for a third: c1 would make one with c5.
  EXPECT_TRUE(take(engine->OnMessage("c5", Hello("c5"), 13'000, nullptr)).empty())
      << "c1 was drawn before it spoke again";
  net::Envelope heartbeat;
  heartbeat.header.set_version(wire::VERSION_1);
  heartbeat.header.mutable_heartbeat();
  EXPECT_EQ(take(engine->OnMessage("c1", heartbeat, 14'000, nullptr)),
            (std::set<std::string>{"c1", "c5"}));
  EXPECT_EQ(engine->last_committed_round(), 1u);
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// The stalled group closes in the same pass as a group that commits at the
// same instant, after it (by id): the schedule committed with that version
// marks it closing, as it marks a group whose engine is done, so a resume
// catches up only once it has closed again.
TEST(FedBuffEngineTest, AGroupClosingForAbsentMembersIsClosingInTheSchedule) {
  config::RunConfig config = Config();
  config.mutable_fedbuff()->set_buffer_size(3);
  config.mutable_fedbuff()->set_concurrency(6);
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto engine = NewEngine(config, store.get());
  std::map<std::string, wire::RoundTask> tasks;
  for (const char* name : {"c0", "c1", "c2", "c3", "c4", "c5"}) {
    for (const Outgoing& o : engine->OnMessage(name, Hello(name), 0, nullptr)) {
      if (o.header.has_task()) tasks[o.peer] = o.header.task();
    }
  }
  ASSERT_EQ(tasks.size(), 6u);
  // Group 1 (c0, c1, c2) has two updates, enough; group 2 (c3, c4, c5) one.
  for (const char* name : {"c0", "c1", "c3"}) {
    (void)engine->OnMessage(name, UpdateFor(tasks.at(name), 1.0f), 1000, nullptr);
  }
  (void)engine->OnTick(11'000);  // Both deadlines: group 1 commits, group 2 closes.
  ASSERT_EQ(engine->last_committed_round(), 1u);
  const store::Checkpoint cp = std::move(store->LatestCheckpoint()).value();
  checkpoint::FedBuffSchedule schedule;
  ASSERT_TRUE(schedule.ParseFromString(cp.schedule));
  ASSERT_EQ(schedule.groups_size(), 1);
  EXPECT_EQ(schedule.groups(0).id(), 2u);
  EXPECT_TRUE(schedule.groups(0).closes_at_commit());
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// A client a group's engine bans (here: it changed its sample count during
// the round) is drawn into no later group, and the schedule committed after
// it keeps the ban, so a resumed run draws it into none either. (Each group
// has an engine and an in-memory store of its own: the ban used to end
// with the group.)
TEST(FedBuffEngineTest, AClientBannedInAGroupIsDrawnIntoNoLaterGroup) {
  const config::RunConfig config = OneGroupAtATime();
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto engine = NewEngine(config, store.get());
  const std::optional<wire::RoundTask> task = FirstGroup(*engine);
  ASSERT_TRUE(task.has_value());
  net::Envelope recount = Hello("c1");
  recount.header.mutable_hello()->set_num_samples(200);
  (void)engine->OnMessage("c1", recount, 2, nullptr);
  const net::Envelope update = UpdateFor(*task, 1.0f);
  EXPECT_TRUE(Tasked(engine->OnMessage("c0", update, 3, nullptr)).empty())
      << "a group opened with the banned c1";
  EXPECT_EQ(engine->last_committed_round(), 1u);
  EXPECT_TRUE(Tasked(engine->OnMessage("c1", Hello("c1"), 4, nullptr)).empty());
  EXPECT_EQ(Tasked(engine->OnMessage("c2", Hello("c2"), 5, nullptr)),
            (std::set<std::string>{"c0", "c2"}));
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();

  // The schedule of version 1 names the ban, and a resumed run keeps it.
  checkpoint::FedBuffSchedule schedule;
  ASSERT_TRUE(schedule.ParseFromString(std::move(store->LatestCheckpoint()).value().schedule));
  ASSERT_EQ(schedule.banned().count("c1"), 1u);
  EXPECT_NE(schedule.banned().at("c1").find("changed its sample count from 100 to 200"),
            std::string::npos)
      << schedule.banned().at("c1");
  EXPECT_EQ(std::vector<std::string>(schedule.free().begin(), schedule.free().end()),
            (std::vector<std::string>{"c0"}));
  engine.reset();
  auto resumed = NewEngine(config, store.get());
  (void)resumed->OnMessage("c0", Hello("c0"), 10, nullptr);
  EXPECT_TRUE(Tasked(resumed->OnMessage("c1", Hello("c1"), 11, nullptr)).empty());
  EXPECT_EQ(Tasked(resumed->OnMessage("c3", Hello("c3"), 12, nullptr)),
            (std::set<std::string>{"c0", "c3"}));
}

// A free client silent past rounds.client_timeout_s (a daemon that died
// between groups) is drawn into no group, with a line naming it; once it
// speaks again it is free, last in line.
TEST(FedBuffEngineTest, AFreeClientSilentPastTheTimeoutIsDrawnIntoNoGroup) {
  config::RunConfig config = Config();
  config.mutable_fedbuff()->set_concurrency(6);  // Three groups in flight.
  // The default Env logs to spdlog's default logger: read its lines.
  std::ostringstream lines;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(lines);
  spdlog::default_logger_raw()->sinks().push_back(sink);
  auto store = std::move(store::OpenSqliteRunStore(":memory:")).value();
  auto engine = NewEngine(config, store.get());
  EXPECT_TRUE(Tasked(engine->OnMessage("c0", Hello("c0"), 0, nullptr)).empty());
  // The driver wakes the engine when c0 times out (100 s).
  ASSERT_TRUE(engine->NextWakeup().has_value());
  EXPECT_LE(*engine->NextWakeup(), 100'001);
  EXPECT_TRUE(engine->OnTick(150'000).empty());
  EXPECT_TRUE(Tasked(engine->OnMessage("c1", Hello("c1"), 150'000, nullptr)).empty())
      << "a group was drawn with the silent c0";
  EXPECT_EQ(Tasked(engine->OnMessage("c2", Hello("c2"), 151'000, nullptr)),
            (std::set<std::string>{"c1", "c2"}));
  spdlog::default_logger_raw()->sinks().pop_back();
  EXPECT_NE(lines.str().find("fedbuff: client c0: no message for 150.0 s; drawn into no group "
                             "until it speaks again"),
            std::string::npos)
      << lines.str();
  // c0 speaks again: free, and drawn with the next client.
  net::Envelope heartbeat;
  heartbeat.header.set_version(wire::VERSION_1);
  heartbeat.header.mutable_heartbeat();
  EXPECT_TRUE(Tasked(engine->OnMessage("c0", heartbeat, 152'000, nullptr)).empty());
  EXPECT_EQ(Tasked(engine->OnMessage("c3", Hello("c3"), 153'000, nullptr)),
            (std::set<std::string>{"c0", "c3"}));
  // A silent client that comes back with a Hello (a restarted daemon) is
  // free again too.
  EXPECT_TRUE(Tasked(engine->OnMessage("c4", Hello("c4"), 154'000, nullptr)).empty());
  (void)engine->OnTick(300'000);
  EXPECT_TRUE(Tasked(engine->OnMessage("c4", Hello("c4"), 300'000, nullptr)).empty());
  EXPECT_EQ(Tasked(engine->OnMessage("c5", Hello("c5"), 300'001, nullptr)),
            (std::set<std::string>{"c4", "c5"}));
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// A driver whose clients register over real time (the daemon) gives them
// a grace. A client still missing after it (a daemon that is down) does
// not stop the run: it is set aside, the group in flight it was in is
// abandoned, and its other members are free; its Hello makes it free too.
// ValidSchedule's run restored with a grace of 3 s, `back` registered at
// 1 s, and the engine's log lines kept.
struct GraceRestore {
  explicit GraceRestore(std::initializer_list<const char*> back)
      : sink(std::make_shared<spdlog::sinks::ostream_sink_st>(lines)),
        store(StoreWith(ValidSchedule().SerializeAsString())),
        engine(std::move(FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test"))
                   .value()) {
    spdlog::default_logger_raw()->sinks().push_back(sink);
    engine->set_registration_grace(3000);
    for (const char* name : back) (void)engine->OnMessage(name, Hello(name), 1000, nullptr);
  }
  ~GraceRestore() { spdlog::default_logger_raw()->sinks().pop_back(); }
  std::ostringstream lines;
  std::shared_ptr<spdlog::sinks::ostream_sink_st> sink;
  std::unique_ptr<store::RunStore> store;
  std::unique_ptr<FedBuffEngine> engine;
};

TEST(FedBuffResumeScheduleTest, AfterTheGraceMissingClientsAreSetAsideAndTheRunGoesOn) {
  // c2 (of group 1, with c3) and c5 (free) do not come back; group 1 cannot
  // re-open at 1 s, group 2 (c0, c1) is due at 5 s.
  GraceRestore r({"c0", "c1", "c3", "c4"});
  std::ostringstream& lines = r.lines;
  FedBuffEngine* engine = r.engine.get();
  (void)engine->OnTick(1000);
  (void)engine->OnTick(3999);
  EXPECT_EQ(lines.str().find("of the committed schedule"), std::string::npos) << lines.str();
  (void)engine->OnTick(4000);
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
  const std::string gone =
      "has not registered within 3 s of the restart; the run goes on without it, and it is "
      "drawn into no group until it registers";
  EXPECT_NE(lines.str().find("fedbuff: resuming after version 1: client c2 of the committed "
                             "schedule " +
                             gone + "; group 1 (from version 0), which it was in, is abandoned\n"),
            std::string::npos)
      << lines.str();
  EXPECT_NE(lines.str().find("client c5 of the committed schedule " + gone + "\n"),
            std::string::npos)
      << lines.str();
  // At the commit's time group 2 re-opens, and a new group forms from the
  // free clients in order: c4, then c3 (freed from group 1).
  EXPECT_EQ(Tasked(engine->OnTick(5000)), (std::set<std::string>{"c0", "c1", "c3", "c4"}));
  EXPECT_EQ(engine->groups_in_flight(), 2u);
  for (const char* name : {"c5", "c2"}) (void)engine->OnMessage(name, Hello(name), 5001, nullptr);
  EXPECT_EQ(engine->free_clients(), (std::deque<std::string>{"c5", "c2"}));
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
}

// Both members of a restored group missing after the grace: each one's line
// names the abandoned group, not only the first's.
TEST(FedBuffResumeScheduleTest, EveryMissingMemberNamesItsAbandonedGroup) {
  GraceRestore r({"c0", "c1", "c4", "c5"});
  std::ostringstream& lines = r.lines;
  FedBuffEngine* engine = r.engine.get();
  (void)engine->OnTick(4000);
  EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
  for (const char* name : {"c2", "c3"}) {
    EXPECT_NE(lines.str().find("client " + std::string(name) +
                               " of the committed schedule has not registered within 3 s of the "
                               "restart; the run goes on without it, and it is drawn into no "
                               "group until it registers; group 1 (from version 0), which it was "
                               "in, is abandoned\n"),
              std::string::npos)
        << name << ":\n"
        << lines.str();
  }
  EXPECT_EQ(engine->free_clients(), (std::deque<std::string>{"c4", "c5"}));
}

// A member of a restored group that is revoked (SIGHUP) and says Hello
// again before the group re-opens stays in its group, not also free; one
// revoked when its group is abandoned is not freed.
TEST(FedBuffResumeScheduleTest, ARevokedMemberOfARestoredGroupIsFreedNeitherTwiceNorWhenRevoked) {
  for (const bool all_return : {true, false}) {
    auto store = StoreWith(ValidSchedule().SerializeAsString());
    auto engine =
        std::move(FedBuffEngine::Create(Config(), {}, store.get(), Evaluator(), "test")).value();
    engine->set_registration_grace(3000);
    (void)engine->OnMessage("c3", Hello("c3"), 500, nullptr);
    EXPECT_TRUE(Rejected(engine->Revoke("c3", "its key was removed", 600), "c3"));
    if (all_return) (void)engine->OnMessage("c3", Hello("c3"), 700, nullptr);
    for (const char* name : {"c0", "c1", "c4", "c5"}) {
      (void)engine->OnMessage(name, Hello(name), 1000, nullptr);
    }
    if (all_return) {
      (void)engine->OnMessage("c2", Hello("c2"), 1000, nullptr);
      EXPECT_EQ(engine->groups_in_flight(), 1u) << "group 1 (c2, c3) did not re-open";
    }
    (void)engine->OnTick(4000);
    EXPECT_TRUE(engine->store_error().ok()) << engine->store_error();
    EXPECT_EQ(engine->free_clients(), (std::deque<std::string>{"c4", "c5"}))
        << "c2 returns: " << all_return;
  }
}

// A run that finishes drops its groups in flight; a member of one revoked
// after that (the daemon reloads its allowlist until it exits) is
// rejected, and the engine does not look for its dropped group.
TEST(FedBuffResumeScheduleTest, ARevokeAfterTheRunFinishedRejectsTheClient) {
  config::RunConfig config = Config();
  config.mutable_rounds()->set_num_rounds(2);
  auto store = StoreWith(ValidSchedule().SerializeAsString(), config);
  auto engine =
      std::move(FedBuffEngine::Create(config, {}, store.get(), Evaluator(), "test")).value();
  std::map<std::string, wire::RoundTask> tasks;
  auto keep_tasks = [&tasks](const std::vector<Outgoing>& out) {
    for (const Outgoing& o : out) {
      if (o.header.has_task()) tasks[o.peer] = o.header.task();
    }
  };
  for (const char* name : {"c0", "c1", "c2", "c3", "c4", "c5"}) {
    keep_tasks(engine->OnMessage(name, Hello(name), 1000, nullptr));
  }
  keep_tasks(engine->OnTick(5000));  // Group 2 (c0, c1) re-opens.
  ASSERT_EQ(engine->groups_in_flight(), 2u);
  // Group 1 (c2, c3) answers: version 2, the last; group 2 is dropped.
  for (const char* name : {"c2", "c3"}) {
    ASSERT_EQ(tasks.count(name), 1u) << name << " got no task";
    net::Envelope e;
    e.header.set_version(wire::VERSION_1);
    wire::Update& u = *e.header.mutable_update();
    u.set_round(tasks[name].round());
    u.set_task_id(tasks[name].task_id());
    u.set_num_samples(100);
    u.set_train_loss(0.5);
    e.payloads.push_back(std::vector<float>(kParams, 0.0f));
    (void)engine->OnMessage(name, e, 5001, nullptr);
  }
  ASSERT_TRUE(engine->done()) << engine->store_error();
  EXPECT_TRUE(Rejected(engine->Revoke("c0", "its key was removed", 5002), "c0"));
}

}  // namespace
}  // namespace cohort::coordinator
