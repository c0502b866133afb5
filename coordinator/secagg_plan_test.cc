#include "coordinator/secagg_plan.h"

#include <gtest/gtest.h>

namespace cohort::coordinator {
namespace {

config::RunConfig Secure(uint32_t min_clients, uint32_t start_clients) {
  config::RunConfig c;
  c.mutable_rounds()->set_min_clients(min_clients);
  c.mutable_rounds()->set_start_clients(start_clients);
  return c;  // SecAgg+ at the defaults: corrupt_fraction 0.1.
}

TEST(SecAggPlanTest, FourClientsTolerateNoDropoutAndTheWarningNamesTheFields) {
  const config::RunConfig c = Secure(3, 4);
  EXPECT_EQ(FirstRoundClients(c), 4u);
  auto plan = PlanSecureRound(c, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->n, 4u);
  EXPECT_EQ(plan->k, 3u);
  EXPECT_EQ(plan->t, 3u);
  EXPECT_TRUE(plan->complete);
  EXPECT_EQ(plan->survives, 0u);
  auto warning = NoDropoutWarning(c, 4);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("a secure round of n=4 tolerates no dropout (t=3 of k=3)"),
            std::string::npos)
      << *warning;
  EXPECT_NE(warning->find("rounds.min_clients and rounds.start_clients"), std::string::npos);
  EXPECT_NE(warning->find("secagg.corrupt_fraction"), std::string::npos);
  const auto lines = DescribePlan(c, 4);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "secure round with 4 clients available: cohort n=4, complete graph k=3, threshold t=3");
  EXPECT_NE(lines[1].find("commit_seed 0, advertise_keys 0"), std::string::npos) << lines[1];
}

TEST(SecAggPlanTest, ALargerCohortSurvivesDropoutsAndIsNotWarnedAbout) {
  const config::RunConfig c = Secure(3, 0);
  auto plan = PlanSecureRound(c, 10);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->n, 10u);  // fraction 1.0: every available client.
  EXPECT_GT(plan->survives, 0u);
  EXPECT_EQ(plan->survives, plan->k - plan->t);
  EXPECT_FALSE(NoDropoutWarning(c, 10).has_value());
  // The warning for n=4 names a cohort that survives one.
  auto warning = NoDropoutWarning(c, 4);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("survives"), std::string::npos) << *warning;
}

// FedBuff's groups of 3 or 4 tolerate no dropout either; the advice names
// the field that sizes them (rounds.start_clients is refused with fedbuff).
TEST(SecAggPlanTest, ASmallFedBuffGroupIsWarnedAboutByItsOwnField) {
  config::RunConfig c;
  c.mutable_rounds()->set_min_clients(3);
  c.mutable_fedbuff()->set_buffer_size(3);
  c.mutable_fedbuff()->set_concurrency(3);
  EXPECT_EQ(FirstRoundClients(c), 3u);
  auto warning = NoDropoutWarning(c, 3);
  ASSERT_TRUE(warning.has_value());
  EXPECT_EQ(*warning,
            "a secure fedbuff group of n=3 tolerates no dropout (t=2 of k=2): one client leaving "
            "aborts it. Raise fedbuff.buffer_size (and fedbuff.concurrency, a multiple of it) "
            "(n=5 survives 1), or lower secagg.corrupt_fraction (now 0.1)");
  // `cohort plan` and `cohort status` plan a fedbuff run's groups, not
  // rounds.min_clients (a review found the plan warned about n=3 here).
  c.mutable_fedbuff()->set_buffer_size(10);
  c.mutable_fedbuff()->set_concurrency(10);
  EXPECT_EQ(FirstRoundClients(c), 10u);
  EXPECT_FALSE(NoDropoutWarning(c, FirstRoundClients(c)).has_value());
}

TEST(SecAggPlanTest, TooFewClientsAndPlainAggregation) {
  config::RunConfig c = Secure(5, 0);
  auto few = PlanSecureRound(c, 4);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("4 clients available: a round needs at least 5"),
            std::string::npos)
      << few.status();
  c.mutable_secagg()->set_aggregation(config::PLAIN);
  EXPECT_FALSE(PlanSecureRound(c, 10).ok());
  EXPECT_EQ(DescribePlan(c, 10)[0], "plain aggregation: the coordinator sees each client's update");
  EXPECT_FALSE(NoDropoutWarning(c, 10).has_value());
  // With secure aggregation the smallest cohort is raised to 3.
  EXPECT_EQ(MinRoundClients(Secure(2, 0)), 3u);
}

}  // namespace
}  // namespace cohort::coordinator
