// Compute cost of secure aggregation (the state machines of
// aggregation/secagg.h, no network), in the setting of Bonawitz et al. 2017
// (Table/Fig. "client" and "server" running time): n clients, vectors of m
// 32-bit values, a fraction of clients dropping after ShareKeys (the costly
// case: the server rebuilds their mask keys and removes their pair masks).
//
//   secagg_bench --n N --m M --dropout D --graph complete|secagg+ [--timed C]
//
// Client time: the median, over C timed clients, of one client's five stages.
// The other clients run every stage for real but mask a 1-value input, and
// the server is handed a full-length vector in its place: its cost does not
// depend on the values it sums, and masking every client's input would make
// the benchmark n times slower. The sum is therefore not checked here (the
// tests check exactness).
// Server time: every server call, stage 1 to Finalize.
// Prints one JSON line.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "aggregation/secagg.h"
#include "common/clock.h"
#include "common/rng.h"

using namespace cohort;
using namespace cohort::aggregation;

int main(int argc, char** argv) {
  uint32_t n = 100, timed = 3;
  size_t m = 100000;
  double dropout = 0;
  std::string graph = "complete";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n"))
      n = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--m"))
      m = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--dropout"))
      dropout = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--graph"))
      graph = argv[i + 1];
    else if (!std::strcmp(argv[i], "--timed"))
      timed = std::atoi(argv[i + 1]);
  }
  // The parameter rule plans for the dropout actually injected.
  auto params = ChooseSecAggParams(n, std::max(dropout, 0.05), 0.1, graph == "complete", m);
  if (!params.ok()) {
    std::fprintf(stderr, "%s\n", params.status().ToString().c_str());
    return 2;
  }
  std::vector<crypto::Ed25519KeyPair> keys;
  std::vector<crypto::Ed25519Public> ids;
  for (uint32_t i = 0; i < n; ++i) {
    keys.push_back(std::move(crypto::GenerateEd25519()).value());
    ids.push_back(keys.back().public_key);
  }
  const crypto::MerkleTree roster = RosterTree(ids);
  params->roster = roster.root();
  // Dropped clients: a seeded sample, never the timed ones.
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(42);
  rng.Shuffle(std::span<uint32_t>(order.data() + timed, n - timed));
  const uint32_t drops = static_cast<uint32_t>(dropout * n);
  std::vector<bool> dropped(n, false);
  for (uint32_t i = 0; i < drops; ++i) dropped[order[timed + i]] = true;

  std::vector<std::unique_ptr<SecAggClient>> clients;
  std::vector<double> client_s(n, 0);
  double server_s = 0;
  std::map<std::string, double> server_by_call;  // Where the server's time goes.
  SecAggServer server(*params, ids);
  auto server_call = [&](const char* name, auto&& f) {
    const double t0 = WallSeconds();
    auto r = f();
    const double spent = WallSeconds() - t0;
    server_s += spent;
    server_by_call[name] += spent;
    return r;
  };
  std::map<std::string, double> client_by_call;  // Summed over the timed clients.
  auto timed_call = [&](double& acc, auto&& f, const char* name = nullptr) {
    const double t0 = WallSeconds();
    auto r = f();
    const double spent = WallSeconds() - t0;
    acc += spent;
    if (name != nullptr && &acc - client_s.data() < static_cast<ptrdiff_t>(timed)) {
      client_by_call[name] += spent / timed;
    }
    return r;
  };
  auto must = [](const auto& r) {
    if (!r.ok()) {
      std::fprintf(stderr, "failed: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
  };
  // Stand-in clients mask a 1-value input (length is only checked by
  // MaskInput); everything else they do is real.
  SecAggParams stand_in = *params;
  stand_in.length = 1;
  for (uint32_t i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<SecAggClient>(i < timed ? *params : stand_in, i, &keys[i],
                                                     roster.Proof(i)));
    auto c = timed_call(
        client_s[i], [&] { return clients[i]->CommitSeed(); }, "CommitSeed");
    must(c);
    must(StatusOr<int>(
        server_call("OnSeedCommit", [&] { return server.OnSeedCommit(*c); }).ok() ? 0 : -1));
  }
  auto roots = server_call("CloseSeedCommit", [&] { return server.CloseSeedCommit(); });
  must(roots);
  for (uint32_t i = 0; i < n; ++i) {
    auto a = timed_call(
        client_s[i], [&] { return clients[i]->AdvertiseKeys(roots->at(i)); }, "AdvertiseKeys");
    must(a);
    must(StatusOr<int>(
        server_call("OnAdvertise", [&] { return server.OnAdvertise(*a); }).ok() ? 0 : -1));
  }
  auto list = server_call("CloseAdvertise", [&] { return server.CloseAdvertise(); });
  must(list);
  for (uint32_t i = 0; i < n; ++i) {
    auto s = timed_call(
        client_s[i], [&] { return clients[i]->ShareKeys(list->at(i)); }, "ShareKeys");
    must(s);
    (void)server_call("OnShares", [&] { return server.OnShares(std::move(*s)); });
  }
  auto inbound = server_call("CloseShares", [&] { return server.CloseShares(); });
  must(inbound);
  for (uint32_t i = 0; i < n; ++i) {
    auto check = timed_call(
        client_s[i], [&] { return clients[i]->CheckShares((*inbound)[i]); }, "CheckShares");
    must(check);
    (void)server_call("OnShareCheck", [&] { return server.OnShareCheck(*check); });
  }
  auto checked = server_call("CloseShareCheck", [&] { return server.CloseShareCheck(); });
  must(checked);
  std::vector<uint32_t> input(m);
  for (auto& v : input) v = static_cast<uint32_t>(rng.Next());
  for (uint32_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    auto c = timed_call(
        client_s[i], [&] { return clients[i]->ReceiveChecked(*checked); }, "ReceiveChecked");
    must(c);
    (void)server_call("OnConfirmation", [&] { return server.OnConfirmation(*c); });
  }
  auto confirmed = server_call("CloseConfirmation", [&] { return server.CloseConfirmation(); });
  must(confirmed);
  for (uint32_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    Status rs = timed_call(
        client_s[i], [&] { return clients[i]->ReceiveConfirmations(confirmed->at(i)); },
        "ReceiveConfirmations");
    if (!rs.ok()) return 1;
    MaskedInput masked;
    if (i < timed) {
      std::vector<uint32_t> mine = input;  // Copied outside the timed call.
      auto r = timed_call(
          client_s[i], [&] { return clients[i]->MaskInput(std::move(mine)); }, "MaskInput");
      must(r);
      masked = std::move(*r);
    } else {
      auto r = clients[i]->MaskInput(std::vector<uint32_t>(input.begin(), input.begin() + 1));
      must(r);
      masked.from = i;
      masked.values = input;  // Same cost for the server as a real input.
    }
    (void)server_call("OnMaskedInput", [&] { return server.OnMaskedInput(masked); });
  }
  auto survivors = server_call("CloseMaskedInput", [&] { return server.CloseMaskedInput(); });
  must(survivors);
  for (uint32_t u : survivors->survivors) {
    auto sig = timed_call(
        client_s[u], [&] { return clients[u]->SignSurvivors(*survivors); }, "SignSurvivors");
    must(sig);
    (void)server_call("OnSignature", [&] { return server.OnSignature(*sig); });
  }
  auto request = server_call("CloseConsistency", [&] { return server.CloseConsistency(); });
  must(request);
  for (uint32_t u : survivors->survivors) {
    auto r = timed_call(
        client_s[u], [&] { return clients[u]->Unmask(request->at(u)); }, "Unmask");
    must(r);
    (void)server_call("OnUnmask", [&] { return server.OnUnmask(std::move(*r)); });
  }
  auto sum = server_call("Finalize", [&] { return server.Finalize(); });
  must(sum);
  std::vector<double> t(client_s.begin(), client_s.begin() + timed);
  std::sort(t.begin(), t.end());
  auto json_map = [](const std::map<std::string, double>& by_call) {
    std::string out;
    for (const auto& [name, spent] : by_call) {
      char item[96];
      std::snprintf(item, sizeof(item), "%s\"%s\":%.4f", out.empty() ? "" : ",", name.c_str(),
                    spent);
      out += item;
    }
    return out;
  };
  std::printf(
      "{\"bench\":\"secagg\",\"impl\":\"cohort\",\"graph\":\"%s\",\"n\":%u,\"m\":%zu,\"dropout\":%."
      "2f,"
      "\"k\":%u,\"t\":%u,\"client_s\":%.4f,\"server_s\":%.4f,\"client_by_call\":{%s},"
      "\"server_by_call\":{%s}}\n",
      graph.c_str(), n, m, dropout, params->k, params->t, t[t.size() / 2], server_s,
      json_map(client_by_call).c_str(), json_map(server_by_call).c_str());
  return 0;
}
