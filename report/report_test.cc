#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "report/html_report.h"
#include "report/run_loader.h"
#include "report/svg.h"
#include "store/run_store.h"

namespace cohort::report {
namespace {

// The part of `html` from the figure with data-plot=`plot` to its end.
std::string Figure(const std::string& html, const std::string& plot, size_t nth = 0) {
  size_t at = 0;
  for (size_t i = 0; i <= nth; ++i) {
    at = html.find("data-plot=\"" + plot + "\"", i == 0 ? 0 : at + 1);
    if (at == std::string::npos) return "";
  }
  return html.substr(at, html.find("</figure>", at) - at);
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The marks (circles or rects) of one series of one run in the chart(s)
// with data-plot=`plot` (a per-run chart appears once per run).
size_t Marks(const std::string& html, const std::string& plot, const std::string& series,
             int run = 0) {
  const std::string key = "data-series=\"" + series + "\" data-run=\"" + std::to_string(run) + "\"";
  for (size_t nth = 0;; ++nth) {
    const std::string figure = Figure(html, plot, nth);
    if (figure.empty()) return 0;
    const size_t at = figure.find(key);
    if (at == std::string::npos) continue;
    const std::string g = figure.substr(at, figure.find("</g>", at) - at);
    return Count(g, "<circle") + Count(g, "<rect");
  }
}

store::ClientRoundRecord Client(const std::string& name, const std::string& status,
                                uint64_t samples, const std::string& stage = "") {
  store::ClientRoundRecord c;
  c.client = name;
  c.status = status;
  c.num_samples = samples;
  c.stage = stage;
  c.train_accuracy = 0.5;
  c.upload_bytes = 1000;
  c.download_bytes = 2000;
  c.data_sha256 = std::string(64, 'a');
  return c;
}

// Five secure rounds: central evaluation in rounds 2, 4, 5; federated
// evaluation in rounds 2 and 3; round 3 aborted; stage records throughout.
RunData SecureRun() {
  RunData run;
  run.dir = "runs/secure";
  run.info.config_text = "seed: 5\ntrain {\n  batch_size: 16\n}\n";
  run.info.code_version = "0.1.0";
  run.info.config_sha256 = std::string(64, 'f');
  run.info.world_size = 3;
  run.info.devices = "cpu";
  run.info.last_round = 5;
  for (uint32_t r = 1; r <= 5; ++r) {
    store::RoundRecord rec;
    rec.round = r;
    rec.aggregation = "secagg+";
    rec.selected = 3;
    rec.participants = r == 3 ? 0 : 3;
    rec.train_loss = 1.0 / r;
    rec.seconds = 0.5;
    if (r == 2 || r >= 4) rec.test_accuracy = 0.5 + 0.1 * r, rec.test_loss = 0.3;
    if (r == 2 || r == 3) {
      rec.federated_eval_accuracy = 0.4, rec.federated_eval_loss = 0.9;
      rec.federated_eval_samples = 100;
    }
    if (r == 3) rec.outcome = "aborted", rec.outcome_reason = "too few clients <at> unmasking";
    rec.stages = {{"share", 0.1, 500, 600}, {"mask", 0.2, 700, 800}};
    run.rounds.push_back(rec);
    run.clients[r] = {Client("client-a", "ok", 100), Client("client-b", "ok", 300),
                      Client("client-c", r == 3 ? "dropped" : "ok", 200, r == 3 ? "mask" : "")};
    // client-a and client-b shared their label counts (opt-in); client-c not.
    run.clients[r][0].label_counts = {100, 0, 0};
    run.clients[r][1].label_counts = {100, 150, 50};
  }
  return run;
}

TEST(SvgTest, EscapesEveryHtmlSpecialCharacter) {
  EXPECT_EQ(EscapeHtml("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(FormatValue(1536, Unit::kBytes), "1.5 KiB");
  EXPECT_EQ(FormatValue(12, Unit::kBytes), "12 B");
  EXPECT_EQ(FormatValue(600000, Unit::kPerSecond), "600k /s");
  EXPECT_EQ(FormatValue(0.8345, Unit::kNumber), "0.8345");
  EXPECT_EQ(FormatValue(2.5e6, Unit::kNumber), "2.5M");
}

TEST(SvgTest, AChartWithoutPointsSaysSoInsteadOfAnEmptyAxis) {
  LineChart chart{"acc", "Accuracy", "round", "accuracy"};
  chart.series = {{"test", "test", 0, 0, 0, {}}};
  chart.empty_text = "No accuracy <recorded>.";
  const std::string html = RenderLineChart(chart);
  EXPECT_EQ(html.find("<svg"), std::string::npos) << html;
  EXPECT_NE(html.find("No accuracy &lt;recorded&gt;."), std::string::npos) << html;
  EXPECT_NE(html.find("chart nodata"), std::string::npos);
}

TEST(HtmlReportTest, EveryPlotHasAMarkPerStoredFigure) {
  const std::string html = RenderHtmlReport({SecureRun()});
  EXPECT_EQ(Marks(html, "accuracy", "test_accuracy"), 3u);
  EXPECT_EQ(Marks(html, "accuracy", "federated_eval_accuracy"), 2u);
  EXPECT_EQ(Marks(html, "accuracy", "train_accuracy"), 0u);  // Secure rounds: none.
  EXPECT_EQ(Marks(html, "loss", "train_loss"), 4u);          // Not the aborted round's.
  RunData noised = SecureRun();  // Distributed DP: no train loss is known (-1).
  noised.rounds[0].train_loss = -1;
  EXPECT_EQ(Marks(RenderHtmlReport({noised}), "loss", "train_loss"), 3u);
  EXPECT_EQ(Marks(html, "loss", "test_loss"), 3u);
  EXPECT_EQ(Marks(html, "participation", "selected"), 5u);
  EXPECT_EQ(Marks(html, "round-time", "seconds"), 5u);
  EXPECT_EQ(Marks(html, "bytes", "bytes_in"), 5u);
  EXPECT_EQ(Marks(html, "bytes", "bytes_out"), 5u);
  EXPECT_EQ(Marks(html, "dropouts", "completed"), 5u);
  EXPECT_EQ(Marks(html, "dropouts", "stage:mask"), 1u);
  // No swatch for a stage nobody left at.
  EXPECT_NE(Figure(html, "dropouts").find("left at mask</li>"), std::string::npos);
  EXPECT_EQ(Figure(html, "dropouts").find("left at share"), std::string::npos);
  // And the totals, in the chart's order: 14 completed client-rounds in 5 rounds, then 1 in 1.
  EXPECT_NE(html.find("<td>completed</td><td>14</td><td>5</td></tr>\n"
                      "<tr><td>left at mask</td><td>1</td><td>1</td>"),
            std::string::npos);
  EXPECT_EQ(Marks(html, "stage-time", "share"), 5u);
  EXPECT_EQ(Marks(html, "stage-time", "mask"), 5u);
  EXPECT_EQ(Marks(html, "client-samples", "samples"), 3u);
  EXPECT_EQ(Marks(html, "client-bytes", "upload"), 3u);
  // The bytes: 5 rounds x (500 + 700) received.
  EXPECT_NE(Figure(html, "bytes").find("round 1: 1.17 KiB"), std::string::npos);
  // The spread of the sample counts, and what the store cannot say.
  EXPECT_NE(html.find("3 clients, 600 samples in all; min 100, median 200, max 300 (max/min 3.00)"),
            std::string::npos);
  // The label skew of the two clients that shared their counts: a mark per
  // class they have (client-a only label 0; client-b all three), each a
  // share of the client's samples.
  EXPECT_EQ(Marks(html, "label-skew", "label:0"), 2u);
  EXPECT_EQ(Marks(html, "label-skew", "label:1"), 1u);
  EXPECT_EQ(Marks(html, "label-skew", "label:2"), 1u);
  EXPECT_NE(Figure(html, "label-skew").find("2 of 3 clients shared their label counts"),
            std::string::npos);
  EXPECT_NE(Figure(html, "label-skew").find("client-b, label 1: 50"), std::string::npos)
      << Figure(html, "label-skew");
  // The lineage.
  for (const std::string& field :
       {std::string(64, 'f'), std::string(64, 'a'), std::string("0.1.0")}) {
    EXPECT_NE(html.find(field), std::string::npos) << field;
  }
  // A checksum may break anywhere in its cell; a name stays whole.
  EXPECT_NE(html.find("<td class=\"wrap\">" + std::string(64, 'a') + "</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>client-a</td>"), std::string::npos);
  // Aborted rounds and why (escaped).
  EXPECT_NE(html.find("too few clients &lt;at&gt; unmasking"), std::string::npos);
  EXPECT_EQ(html.find("<rank-throughput"), std::string::npos);  // Not data-parallel.
}

TEST(HtmlReportTest, StringsFromTheStoreAreEscapedAndNothingIsFetched) {
  RunData run = SecureRun();
  run.dir = "runs/<b>x</b>";
  run.info.config_text = "name: \"</pre><script>alert(1)</script>\"\n";
  run.clients[1][0].client = "<img src=x onerror=alert(1)>";
  run.clients[1][1].reason = "a \"quoted\" & 'odd' reason";
  run.rounds[0].stages[0].stage = "<svg onload=alert(1)>";
  const std::string html = RenderHtmlReport({run});
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<svg onload"), std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
  EXPECT_NE(html.find("runs/&lt;b&gt;x&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(html.find("http:"), std::string::npos);
  EXPECT_EQ(html.find("https:"), std::string::npos);
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);
}

TEST(HtmlReportTest, AnEmptyRunSaysThereIsNothingToDraw) {
  RunData run;
  run.dir = "runs/new";
  run.info.config_text = "seed: 1\n";
  const std::string html = RenderHtmlReport({run});
  EXPECT_EQ(html.find("<svg class=\"plot\""), std::string::npos);
  EXPECT_NE(html.find("The run has committed no round yet."), std::string::npos);
  EXPECT_NE(Figure(html, "accuracy").find("No accuracy recorded"), std::string::npos);
  EXPECT_NE(Figure(html, "bytes").find("No byte counts in these stores"), std::string::npos);
  EXPECT_NE(html.find("No per-client records in this run."), std::string::npos);
}

RunData DataParallelRun() {
  RunData run;
  run.dir = "runs/dp";
  run.info.config_text = "mode: DATA_PARALLEL\nseed: 7\ntrain {\n  batch_size: 8\n}\n";
  for (uint32_t e = 1; e <= 3; ++e) {
    store::RoundRecord rec;
    rec.round = e;
    rec.aggregation = "all-reduce";
    rec.participants = rec.selected = 2;
    rec.train_loss = 0.5;
    rec.test_accuracy = 0.8, rec.test_loss = 0.4;
    for (uint32_t k = 0; k < 2; ++k) {
      rec.ranks.push_back({k, 10, 1000, 0.6, 0.3, 1.0 + k, "cpu"});
    }
    run.rounds.push_back(rec);
  }
  return run;
}

TEST(HtmlReportTest, ADataParallelRunShowsItsRanks) {
  const std::string html = RenderHtmlReport({DataParallelRun()});
  EXPECT_EQ(Marks(html, "rank-throughput", "rank-0"), 3u);
  EXPECT_EQ(Marks(html, "rank-throughput", "rank-1"), 3u);
  EXPECT_NE(Figure(html, "rank-throughput").find("epoch 2: 500 /s"), std::string::npos);
  EXPECT_EQ(Marks(html, "rank-time", "compute"), 2u);
  EXPECT_EQ(Marks(html, "rank-time", "comm"), 2u);
  EXPECT_EQ(Marks(html, "rank-time", "other"), 2u);  // Rank 0: 0.1 s a epoch; rank 1: 1.1 s.
  EXPECT_NE(html.find("No per-client records: a data-parallel run"), std::string::npos);
  EXPECT_NE(Figure(html, "accuracy").find(">epoch<"), std::string::npos);
}

TEST(HtmlReportTest, SeveralRunsAreOverlaidAndTheirConfigsCompared) {
  RunData a = SecureRun(), b = SecureRun();
  b.dir = "runs/other";
  b.info.config_text = "seed: 6\ntrain {\n  batch_size: 16\n  momentum: 0.9\n}\n";
  b.rounds.pop_back();
  const std::string html = RenderHtmlReport({a, b});
  EXPECT_EQ(Marks(html, "accuracy", "test_accuracy", 0), 3u);
  EXPECT_EQ(Marks(html, "accuracy", "test_accuracy", 1), 2u);
  EXPECT_NE(html.find("run 2: test (central evaluation)"), std::string::npos);
  EXPECT_NE(html.find("<td>seed</td><td>5</td><td>6</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>train.momentum</td><td>(unset: "
                      "default)</td><td>0.9</td>"),
            std::string::npos);
  EXPECT_EQ(html.find("<td>train.batch_size</td>"), std::string::npos);
  EXPECT_NE(html.find("The fields whose values differ (2 of 3)"), std::string::npos);
  // A section per run.
  EXPECT_EQ(Marks(html, "dropouts", "completed", 1), 4u);
}

TEST(HtmlReportTest, ConfigsFlattenFieldByField) {
  const auto flat = FlattenConfig(
      "seed: 5\nmodel {\n  arch: \"mlp\"\n  layers {\n    kind: \"conv\"\n  }\n  layers {\n"
      "    kind: \"dense\"\n  }\n}\nrounds {\n  num_rounds: 3\n}\n");
  const std::vector<std::pair<std::string, std::string>> want = {
      {"seed", "5"},
      {"model.arch", "\"mlp\""},
      {"model.layers.kind", "\"conv\""},
      {"model.layers[1].kind", "\"dense\""},
      {"rounds.num_rounds", "3"}};
  EXPECT_EQ(flat, want);
}

// 100 rounds of 10 clients with eight stages: well under 1 MB.
TEST(HtmlReportTest, AHundredRoundsWeighUnderAMegabyte) {
  RunData run = SecureRun();
  run.rounds.clear();
  run.clients.clear();
  for (uint32_t r = 1; r <= 100; ++r) {
    store::RoundRecord rec;
    rec.round = r, rec.aggregation = "secagg+", rec.selected = rec.participants = 10;
    rec.test_accuracy = 0.9, rec.test_loss = 0.2, rec.train_loss = 0.3, rec.seconds = 1;
    rec.federated_eval_samples = 10, rec.federated_eval_accuracy = 0.8;
    for (int s = 0; s < 8; ++s) rec.stages.push_back({"stage" + std::to_string(s), 0.1, 100, 100});
    run.rounds.push_back(rec);
    for (int c = 0; c < 10; ++c)
      run.clients[r].push_back(Client("c" + std::to_string(c), "ok", 50));
  }
  const std::string html = RenderHtmlReport({run});
  std::printf("100 rounds, 10 clients, 8 stages: %zu bytes\n", html.size());
  EXPECT_LT(html.size(), 1000000u);
  EXPECT_EQ(Marks(html, "stage-time", "stage7"), 100u);
}

class RunLoaderTest : public ::testing::Test {
 protected:
  RunLoaderTest() {
    dir_ = std::filesystem::temp_directory_path() /
           ("cohort-report-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  ~RunLoaderTest() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static store::Checkpoint Model(uint32_t round) {
    store::Checkpoint cp;
    cp.round = round;
    cp.model.assign(64, float(round));
    return cp;
  }
  // A store with `rounds` committed rounds of two clients.
  void WriteRun(const std::string& db, uint32_t rounds) {
    auto store = std::move(store::OpenSqliteRunStore(db)).value();
    store::RunInfo info;
    info.config_text = "seed: 3\n";
    info.seed = 3;
    info.code_version = "0.1.0";
    ASSERT_TRUE(store->CreateRun(info, Model(0)).ok());
    for (uint32_t r = 1; r <= rounds; ++r) {
      store::RoundRecord rec;
      rec.round = r, rec.participants = rec.selected = 2, rec.test_accuracy = 0.5;
      ASSERT_TRUE(
          store->CommitRound(rec, {Client("a", "ok", 10), Client("b", "ok", 20)}, Model(r), 2)
              .ok());
    }
  }
  using Files = std::map<std::string, std::pair<std::string, std::filesystem::file_time_type>>;
  // Every file below the test's directory: its bytes and mtime.
  Files Snapshot() const {
    Files files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      if (e.is_regular_file()) files[e.path()] = {Bytes(e.path()), e.last_write_time()};
    }
    return files;
  }
  // The files that differ between two snapshots ("" when none).
  static std::string Changes(const Files& before, const Files& after) {
    std::string out;
    for (const auto& [path, v] : before) {
      auto it = after.find(path);
      if (it == after.end()) out += " removed " + path;
      if (it != after.end() && it->second != v) out += " changed " + path;
    }
    for (const auto& [path, v] : after) {
      if (!before.count(path)) out += " created " + path;
    }
    return out;
  }
  // LoadRunData(dir), which must leave every file as it was.
  StatusOr<RunData> Load(const std::string& dir) {
    const Files before = Snapshot();
    StatusOr<RunData> run = LoadRunData(dir);
    EXPECT_EQ(Changes(before, Snapshot()), "") << "reading " << dir;
    return run;
  }
  // The error LoadRunData gives for `dir`; it starts with `dir`.
  Status ErrorFor(const std::string& dir) {
    StatusOr<RunData> run = Load(dir);
    EXPECT_FALSE(run.ok());
    if (!run.ok()) {
      EXPECT_EQ(run.status().message().rfind(dir, 0), 0u) << run.status();
    }
    return run.status();
  }
  std::filesystem::path dir_;
};

TEST_F(RunLoaderTest, ReadsARunsRoundsAndClients) {
  std::filesystem::create_directories(Path("run"));
  WriteRun(Path("run/run.db"), 3);
  StatusOr<RunData> run = Load(Path("run"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->info.last_round, 3u);
  ASSERT_EQ(run->rounds.size(), 3u);
  ASSERT_EQ(run->clients.size(), 3u);
  EXPECT_EQ(run->clients.at(2)[1].num_samples, 20u);
}

TEST_F(RunLoaderTest, ADirectoryThatIsNoRunIsNamedWithWhatItHolds) {
  Status s = ErrorFor(Path("nope"));
  EXPECT_EQ(s.message(), Path("nope") + ": no such run directory");
  std::filesystem::create_directories(Path("shards"));
  std::ofstream(Path("shards/client-000.shard")) << "x";
  std::ofstream(Path("shards/client-001.shard")) << "x";
  s = ErrorFor(Path("shards"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), Path("shards") +
                             ": no run database (run.db) in this directory; it holds 2 shard "
                             "files: a `cohort partition` output, not a run directory");
  std::filesystem::create_directories(Path("keys"));
  std::ofstream(Path("keys/client-000.key")) << "x";
  EXPECT_NE(ErrorFor(Path("keys")).message().find("1 key files: a keys or allowlist directory"),
            std::string::npos);
  std::filesystem::create_directories(Path("runs/demo"));
  WriteRun(Path("runs/demo/run.db"), 1);
  EXPECT_NE(ErrorFor(Path("runs")).message().find("run directories below it: " + Path("runs/demo")),
            std::string::npos);
}

TEST_F(RunLoaderTest, AFileThatIsNoStoreAStoreWithoutARunAndADamagedOneAreRefused) {
  std::filesystem::create_directories(Path("empty"));
  std::ofstream(Path("empty/run.db"));
  Status s = ErrorFor(Path("empty"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not a Cohort run store"), std::string::npos) << s;

  std::filesystem::create_directories(Path("text"));
  std::ofstream(Path("text/run.db")) << std::string(5000, 'x');
  s = ErrorFor(Path("text"));
  EXPECT_NE(s.message().find("not a Cohort run store"), std::string::npos) << s;

  std::filesystem::create_directories(Path("norun"));
  { auto store = std::move(store::OpenSqliteRunStore(Path("norun/run.db"))).value(); }
  s = ErrorFor(Path("norun"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("holds no run yet"), std::string::npos) << s;

  std::filesystem::create_directories(Path("cut"));
  WriteRun(Path("cut/run.db"), 20);
  std::filesystem::resize_file(Path("cut/run.db"),
                               std::filesystem::file_size(Path("cut/run.db")) / 2);
  s = ErrorFor(Path("cut"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(Path("cut/run.db") + ": the run store is damaged ("),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace cohort::report
