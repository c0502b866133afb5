// Writes the seed corpus of every harness (tests/fuzz/corpus/<name>/):
// valid inputs and near misses, small enough to replay in milliseconds.
// Usage: make_fuzz_corpus DIR (normally tests/fuzz/corpus). Deterministic.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/secagg_wire.h"
#include "datasets/shard.h"
#include "net/envelope.h"
#include "tests/fuzz/secagg_cohort.h"

namespace cohort::fuzz {
namespace {

namespace fs = std::filesystem;

fs::path g_root;

void Put(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

std::string U16(size_t v) { return {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)}; }

std::string BigEndian32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string Gzip(const std::string& plain) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip wrapper.
  std::string out(deflateBound(&z, plain.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = static_cast<uInt>(plain.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// --- envelope ------------------------------------------------------------------

std::string Frames(uint8_t mode, const std::vector<std::string>& frames) {
  std::string out(1, static_cast<char>(mode));
  for (const auto& f : frames) out += U16(f.size()) + f;
  return out;
}

// Limits byte of envelope_fuzz.cc: payload limit 16 floats, one payload frame.
constexpr uint8_t kOnePayload = (2 << 1) | (1 << 3);

void Envelopes() {
  auto header = [](auto fill) {
    wire::Header h;
    h.set_version(wire::VERSION_1);
    fill(h);
    return h.SerializeAsString();
  };
  const std::string payload(16 * sizeof(float), '\x01');
  Put("envelope", "hello", Frames(0, {header([](wire::Header& h) {
                                    h.mutable_hello()->set_client_name("client-7");
                                    h.mutable_hello()->set_num_samples(600);
                                    h.mutable_hello()->set_identity_key(std::string(32, 'k'));
                                  })}));
  Put("envelope", "welcome", Frames(0, {header([](wire::Header& h) {
                                      auto* w = h.mutable_welcome();
                                      w->set_run_name("demo");
                                      w->mutable_model()->set_arch("mlp");
                                      w->mutable_model()->set_input_dim(784);
                                      w->mutable_model()->add_hidden(200);
                                      w->set_num_params(16);
                                    })}));
  Put("envelope", "task",
      Frames(kOnePayload, {header([](wire::Header& h) {
                             auto* t = h.mutable_task();
                             t->set_round(3);
                             t->set_task_id(9);
                             t->mutable_train()->set_batch_size(32);
                             auto* s = t->mutable_secagg();
                             s->set_n(4);
                             s->set_k(3);
                             s->set_t(2);
                             s->set_context(std::string(32, 'c'));
                             s->set_roster_root(std::string(32, 'r'));
                             s->add_roster_proof(std::string(32, 'p'));
                             s->add_roster_proof(std::string(32, 'q'));
                           }),
                           payload}));
  Put("envelope", "update",
      Frames(kOnePayload, {header([](wire::Header& h) {
                             h.mutable_update()->set_round(3);
                             h.mutable_update()->set_num_samples(600);
                             h.mutable_update()->set_masked(true);
                           }),
                           payload}));
  Put("envelope", "heartbeat",
      Frames(0, {header([](wire::Header& h) { h.mutable_heartbeat()->set_finished(true); })}));
  Put("envelope", "error", Frames(0, {header([](wire::Header& h) {
                                    h.mutable_error()->set_code(wire::SECAGG_REFUSED);
                                    h.mutable_error()->set_message("refused");
                                  })}));
  Put("envelope", "secagg_keys", Frames(0, {header([](wire::Header& h) {
                                          auto* k = h.mutable_secagg_keys()->add_adverts();
                                          k->set_index(1);
                                          k->set_enc_key(std::string(32, 'e'));
                                          k->set_mask_key(std::string(32, 'm'));
                                          k->set_signature(std::string(64, 's'));
                                        })}));
  Put("envelope", "secagg_shares", Frames(0, {header([](wire::Header& h) {
                                            auto* s = h.mutable_secagg_shares()->add_shares();
                                            s->set_peer(2);
                                            s->set_ciphertext(std::string(128, 'x'));
                                          })}));
  Put("envelope", "secagg_unmask_request", Frames(0, {header([](wire::Header& h) {
                                                    auto* r = h.mutable_secagg_unmask_request();
                                                    r->add_survivors(0);
                                                    r->add_survivors(1);
                                                    r->add_dropped(2);
                                                    r->add_signatures()->set_index(1);
                                                  })}));
  Put("envelope", "secagg_unmask", Frames(0, {header([](wire::Header& h) {
                                            auto* s = h.mutable_secagg_unmask()->add_shares();
                                            s->set_about(1);
                                            s->set_self_mask(true);
                                            s->set_share(std::string(44, 'q'));
                                          })}));
  // Near misses.
  wire::Header old;
  old.mutable_finished()->set_rounds(1);
  Put("envelope", "no_version", Frames(0, {old.SerializeAsString()}));
  Put("envelope", "no_body", Frames(0, {header([](wire::Header&) {})}));
  Put("envelope", "odd_payload",
      Frames(kOnePayload, {header([](wire::Header& h) { h.mutable_update(); }), "abc"}));
  Put("envelope", "two_payloads",
      Frames(kOnePayload, {header([](wire::Header& h) { h.mutable_update(); }), payload, payload}));
  Put("envelope", "garbage", Frames(1, {"\x0a\xff\xff\xff\xff\x0f"}));
  // Bit 5 stretches the first payload frame to a full 1 MiB chunk: a
  // payload of two frames, joined (limit 2^20 floats, three frames).
  constexpr uint8_t kFullChunks = (3 << 1) | (3 << 3) | 0x20;
  Put("envelope", "two_chunks",
      Frames(kFullChunks, {header([](wire::Header& h) { h.mutable_update()->set_round(1); }),
                           payload, payload}));
  // Bit 6 stretches the last frame too: a payload of exactly one chunk.
  constexpr uint8_t kExactChunk = (3 << 1) | (1 << 3) | 0x40;
  Put("envelope", "one_exact_chunk",
      Frames(kExactChunk,
             {header([](wire::Header& h) { h.mutable_update()->set_round(1); }), payload}));
}

// --- config ----------------------------------------------------------------------

void Configs() {
  const std::string minimal = R"(mode: FEDERATED
model { arch: "logreg" input_dim: 4 num_classes: 2 }
train { local_epochs: 1 batch_size: 8 learning_rate: 0.1 }
rounds { num_rounds: 2 min_clients: 1 round_deadline_s: 10 client_timeout_s: 5 keep_checkpoints: 1 }
secagg { aggregation: PLAIN }
)";
  Put("config", "minimal.textproto", minimal);
  Put("config", "secagg.textproto", R"(name: "fmnist" seed: 3 mode: FEDERATED
data { test_shard: "runs/demo/shards/test.shard" }
model { arch: "mlp" input_dim: 784 num_classes: 10 hidden: 200 hidden: 200 }
train { local_epochs: 1 batch_size: 32 learning_rate: 0.05 momentum: 0.9 weight_decay: 0.0001 }
rounds { num_rounds: 10 min_clients: 8 start_clients: 10 fraction: 1.0
         round_deadline_s: 120 client_timeout_s: 30 keep_checkpoints: 3 }
server { learning_rate: 1.0 momentum: 0 }
net { heartbeat_s: 1.0 }
secagg { aggregation: SECAGG_PLUS clip: 4 expected_dropout: 0.1 corrupt_fraction: 0.1
         consistency_check: true stage_timeout_s: 10 mask_prg: AES256_CTR }
)");
  Put("config", "minimal.json", R"({"mode": "FEDERATED",
 "model": {"arch": "logreg", "inputDim": 4, "numClasses": 2},
 "train": {"localEpochs": 1, "batchSize": 8, "learningRate": 0.1},
 "rounds": {"numRounds": 2, "minClients": 1, "roundDeadlineS": 10, "clientTimeoutS": 5,
            "keepCheckpoints": 1},
 "secagg": {"aggregation": "SECAGG", "clip": 2, "maskPrg": "CHACHA20"}}
)");
  Put("config", "unknown_field.textproto", "mode: FEDERATED\nmodel { arch: \"mlp\" depth: 3 }\n");
  std::string bad_momentum = minimal;
  bad_momentum.replace(bad_momentum.find("learning_rate: 0.1"), 18,
                       "learning_rate: 0.1 momentum: 1.5");
  Put("config", "bad_value.textproto", bad_momentum);
  std::string adamw = minimal;
  adamw.replace(adamw.find("learning_rate: 0.1"), 18,
                "learning_rate: 0.01 optimizer: ADAMW weight_decay: 0.01 beta1: 0.8 beta2: 0.99 "
                "eps: 1e-6");
  Put("config", "adamw.textproto", adamw);
  Put("config", "nesterov.json", R"({"train": {"optimizer": "SGD", "momentum": 0.9,
 "nesterov": true, "dampening": 0}})");
  Put("config", "syntax.textproto", "model { arch: \"mlp\" \n");
  Put("config", "bad.json", R"({"model": {"arch": 7}})");
  Put("config", "empty", "");
}

// --- datasets --------------------------------------------------------------------

datasets::Dataset SmallDataset(bool pixels) {
  datasets::Dataset d;
  d.num_features = 3;
  d.num_classes = 3;
  d.labels = {0, 2, 1, 1};
  for (int i = 0; i < 12; ++i) d.features.push_back(pixels ? i * 20 / 255.0f : i * 0.5f - 2.0f);
  return d;
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void Shards() {
  const fs::path tmp = fs::temp_directory_path() / "cohort-make-corpus.shard";
  auto shard = [&](const datasets::Dataset& d, datasets::FeatureEncoding e) {
    if (!datasets::WriteShard(d, tmp.string(), e).ok()) std::exit(1);
    std::string bytes = ReadAll(tmp);
    fs::remove(tmp);
    return bytes;
  };
  const std::string f32 = shard(SmallDataset(false), datasets::FeatureEncoding::kFloat32);
  const std::string u8 = shard(SmallDataset(true), datasets::FeatureEncoding::kUint8);
  // Flag byte of shard_fuzz.cc: bit 0 = fix the checksums.
  Put("shard", "float32", std::string(1, '\0') + f32);
  Put("shard", "uint8", std::string(1, '\0') + u8);
  Put("shard", "uint8_fixcrc", std::string(1, '\1') + u8);
  Put("shard", "truncated_fixcrc", std::string(1, '\1') + f32.substr(0, f32.size() - 4));
  std::string nan = f32;
  nan.replace(nan.size() - 4, 4, std::string("\x00\x00\xc0\x7f", 4));
  Put("shard", "nan_fixcrc", std::string(1, '\1') + nan);
  std::string label = f32;
  label[48] = 9;  // Label 9 of 3 classes.
  Put("shard", "bad_label_fixcrc", std::string(1, '\1') + label);
  Put("shard", "header_only", std::string(1, '\0') + f32.substr(0, 48));
  Put("shard", "padded_fixcrc", std::string(1, '\1') + f32 + std::string(4, '\0'));
}

void Idx() {
  const uint32_t n = 3, rows = 2, cols = 2;
  std::string labels = BigEndian32(0x801) + BigEndian32(n) + std::string("\x01\x00\x09", 3);
  std::string images = BigEndian32(0x803) + BigEndian32(n) + BigEndian32(rows) + BigEndian32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) images += static_cast<char>(i * 21);
  // num_classes, label-file length, label file, image file (idx_fuzz.cc).
  auto pair = [](uint8_t classes, const std::string& l, const std::string& i) {
    return std::string(1, static_cast<char>(classes)) + U16(l.size()) + l + i;
  };
  Put("idx", "plain", pair(10, labels, images));
  Put("idx", "gzip", pair(10, Gzip(labels), Gzip(images)));
  Put("idx", "label_too_large", pair(5, labels, images));
  Put("idx", "count_mismatch",
      pair(10, BigEndian32(0x801) + BigEndian32(2) + std::string("\x01\x00", 2), images));
  Put("idx", "truncated_images", pair(10, labels, images.substr(0, images.size() - 1)));
  Put("idx", "one_dimension", pair(10, labels, BigEndian32(0x801) + BigEndian32(3) + "abc"));
  Put("idx", "gzip_truncated", pair(10, labels, Gzip(images).substr(0, 20)));
}

void Csv() {
  // Label column, num_classes, scale selector (csv_fuzz.cc), then the file.
  auto csv = [](int8_t column, uint8_t classes, bool pixels, const std::string& text) {
    return std::string{static_cast<char>(column), static_cast<char>(classes),
                       static_cast<char>(pixels)} +
           text;
  };
  Put("csv", "header", csv(0, 0, false, "label,a,b\n0,1.5,2\n1,-3,4e2\n2,0,0\n"));
  Put("csv", "no_header_crlf", csv(0, 4, false, "1,0.25,0.5\r\n3,1,2\r\n\r\n"));
  Put("csv", "label_last", csv(2, 0, true, "x,y,label\n255,0,1\n128,64,0\n"));
  Put("csv", "ragged", csv(0, 0, false, "0,1,2\n1,2\n"));
  Put("csv", "not_finite", csv(0, 0, false, "0,1,nan\n1,inf,2\n"));
  Put("csv", "bad_label", csv(0, 0, false, "0.5,1\n-1,2\n"));
  Put("csv", "label_out_of_range", csv(9, 0, false, "0,1\n"));
  Put("csv", "only_header", csv(0, 0, false, "a,b,c\n"));
}

// --- secure aggregation -------------------------------------------------------------

std::string ServerStep(ServerOp op, uint32_t i) {
  return {static_cast<char>(op), static_cast<char>(i)};
}

using ServerEdits = std::map<std::pair<ServerOp, uint32_t>, std::string>;

// One honest round; each step (op, client) named in `edits` is replaced by
// its value (whole steps: op, client, edit bytes).
std::string ServerProgram(int config, const ServerEdits& edits = {}) {
  const HonestRound& h = GetHonestRound(config);
  std::string p(1, static_cast<char>(config));
  auto step = [&](ServerOp op, uint32_t i) {
    auto it = edits.find({op, i});
    p += it != edits.end() ? it->second : ServerStep(op, i);
  };
  for (uint32_t i = 0; i < h.params.n; ++i) step(ServerOp::kAdvert, i);
  step(ServerOp::kCloseAdvertise, 0);
  for (uint32_t i = 0; i < h.params.n; ++i) step(ServerOp::kShares, i);
  step(ServerOp::kCloseShares, 0);
  for (uint32_t i = 0; i < h.params.n; ++i) step(ServerOp::kShareCheck, i);
  step(ServerOp::kCloseShareCheck, 0);
  for (uint32_t i = 0; i < h.params.n; ++i) step(ServerOp::kConfirm, i);
  step(ServerOp::kCloseConfirmation, 0);
  for (uint32_t i : h.survivors.survivors) step(ServerOp::kMasked, i);
  step(ServerOp::kCloseMaskedInput, 0);
  for (const auto& [i, s] : h.signatures) step(ServerOp::kSignature, i);
  step(ServerOp::kCloseConsistency, 0);
  for (const auto& [i, r] : h.responses) step(ServerOp::kUnmask, i);
  step(ServerOp::kFinalize, 0);
  return p;
}

// Replaces client i's honest `op` message by the edited one, with the edit
// bytes (the edit count selector, then what each edit reads; see
// secagg_cohort.cc).
std::string EditedServerProgram(int config, ServerOp op, ServerOp edited, uint32_t i,
                                const std::string& edit_bytes) {
  return ServerProgram(config, {{{op, i}, ServerStep(edited, i) + edit_bytes}});
}

void SecAggServer() {
  for (int c = 0; c < kNumConfigs; ++c) {
    const std::string tag = "config" + std::to_string(c) + "_";
    Put("secagg_server", tag + "honest", ServerProgram(c));
    Put("secagg_server", tag + "edited_advert",
        EditedServerProgram(c, ServerOp::kAdvert, ServerOp::kEditedAdvert, 1,
                            std::string("\x00\x00\x03\x05\x01", 5)));
    Put("secagg_server", tag + "edited_shares",
        EditedServerProgram(c, ServerOp::kShares, ServerOp::kEditedShares, 2,
                            std::string("\x00\x01\x02\x00\x00\x07", 6)));
    // Client 1 claims client 2's shares carry a bad signature (they do not).
    Put("secagg_server", tag + "false_complaint",
        EditedServerProgram(c, ServerOp::kShareCheck, ServerOp::kEditedShareCheck, 1,
                            std::string("\x00\x01\x02\x00", 4)));
    // The same with a made-up shared point and proof.
    Put("secagg_server", tag + "false_complaint_point",
        EditedServerProgram(c, ServerOp::kShareCheck, ServerOp::kEditedShareCheck, 1,
                            std::string("\x00\x01\x02\x01", 4) + std::string(96, '\x07')));
    Put("secagg_server", tag + "edited_masked",
        EditedServerProgram(c, ServerOp::kMasked, ServerOp::kEditedMasked, 0,
                            std::string("\x00\x01\x04", 3)));
    Put("secagg_server", tag + "edited_unmask",
        EditedServerProgram(c, ServerOp::kUnmask, ServerOp::kEditedUnmask, 1,
                            std::string("\x00\x04\x00", 3)));
    Put("secagg_server", tag + "resized_share",
        EditedServerProgram(c, ServerOp::kUnmask, ServerOp::kEditedUnmask, 0,
                            std::string("\x00\x08\x00\x20", 4)));
    Put("secagg_server", tag + "forged_dealer_signature",
        EditedServerProgram(c, ServerOp::kUnmask, ServerOp::kEditedUnmask, 0,
                            std::string("\x00\x07\x00\x05\x01", 5)));
    // Client 1's masked input as a raw frame of the right size (8 words).
    Put("secagg_server", tag + "raw_masked",
        ServerProgram(
            c, {{{ServerOp::kMasked, 1},
                 ServerStep(ServerOp::kRawMasked, 0) + "\x01\x20" + std::string(32, '\x05')}}));
  }
  // A confirmation with a flipped tag, and one from a stranger index.
  Put("secagg_server", "config1_edited_confirm",
      EditedServerProgram(1, ServerOp::kConfirm, ServerOp::kEditedConfirm, 1,
                          std::string("\x01\x00\x00\x03", 4)));
  Put("secagg_server", "config0_edited_signature",
      EditedServerProgram(0, ServerOp::kSignature, ServerOp::kEditedSignature, 2,
                          std::string("\x00\x01\x00\x11", 4)));
  // A true complaint: client 2's shares for client 3 arrive with a flipped
  // byte (its signature no longer holds), and client 3 says so after client
  // 2's own check. Client 2 is blamed and out of U3.
  Put("secagg_server", "config0_true_complaint",
      ServerProgram(
          0, {{{ServerOp::kShares, 2},
               ServerStep(ServerOp::kEditedShares, 2) +
                   std::string("\x00\x01\x02\x02\x04\x05\x00\x00\x00\x01", 10)},
              {{ServerOp::kShareCheck, 3},
               ServerStep(ServerOp::kEditedShareCheck, 3) + std::string("\x00\x01\x02\x00", 4)}}));
  // Too few adverts: the round aborts at the first close; nothing after
  // that may succeed.
  Put("secagg_server", "abort",
      std::string(1, '\0') + ServerStep(ServerOp::kAdvert, 0) +
          ServerStep(ServerOp::kCloseAdvertise, 0) + ServerStep(ServerOp::kAdvert, 1) +
          ServerStep(ServerOp::kShares, 0) + ServerStep(ServerOp::kFinalize, 0));
  // Client 0's masked input twice.
  Put("secagg_server", "config0_masked_twice",
      ServerProgram(0, {{{ServerOp::kMasked, 0},
                         ServerStep(ServerOp::kMasked, 0) + ServerStep(ServerOp::kMasked, 0)}}));
}

std::string ClientProgram(int config, uint32_t index, ClientOp edit = ClientOp::kNumOps,
                          const std::string& edit_bytes = "") {
  std::string p{static_cast<char>(config), static_cast<char>(index)};
  auto call = [&](ClientOp op, ClientOp edited) {
    p += static_cast<char>(edit == edited ? edited : op);
    if (edit == edited) p += edit_bytes;
  };
  p += static_cast<char>(ClientOp::kAdvertise);
  call(ClientOp::kShareKeys, ClientOp::kEditedShareKeys);
  call(ClientOp::kCheckShares, ClientOp::kEditedCheckShares);
  call(ClientOp::kReceiveChecked, ClientOp::kEditedReceiveChecked);
  call(ClientOp::kReceiveConfirmations, ClientOp::kEditedReceiveConfirmations);
  p += static_cast<char>(ClientOp::kMaskInput);
  p += '\x01';  // Input of the right length.
  call(ClientOp::kSignSurvivors, ClientOp::kEditedSignSurvivors);
  call(ClientOp::kUnmask, ClientOp::kEditedUnmask);
  return p;
}

void SecAggClient() {
  for (int c = 0; c < kNumConfigs; ++c) {
    const HonestRound& h = GetHonestRound(c);
    const std::string tag = "config" + std::to_string(c) + "_";
    for (uint32_t i = 0; i < h.params.n; ++i) {
      Put("secagg_client", tag + "honest_" + std::to_string(i), ClientProgram(c, i));
    }
    Put("secagg_client", tag + "edited_key_list",
        ClientProgram(c, 0, ClientOp::kEditedShareKeys,
                      std::string("\x00\x05\x00\x00\x03\x01", 6)));
    // One sender's shares with a flipped byte: client 1 complains.
    Put("secagg_client", tag + "edited_inbound",
        ClientProgram(c, 1, ClientOp::kEditedCheckShares, std::string("\x00\x02\x00\x00\x03", 5)));
    // Client 2 taken out of the checked list.
    Put("secagg_client", tag + "edited_checked",
        ClientProgram(c, 0, ClientOp::kEditedReceiveChecked, std::string("\x00\x01\x02", 3)));
    // A confirmation tag flipped or dropped: below t, the client keeps its input.
    Put("secagg_client", tag + "edited_confirmations",
        ClientProgram(c, 0, ClientOp::kEditedReceiveConfirmations, std::string("\x00\x01\x00", 3)));
    Put("secagg_client", tag + "edited_seed_root",
        std::string{static_cast<char>(c), '\x00', static_cast<char>(ClientOp::kEditedAdvertise),
                    '\x00', '\x01', '\x03'});
    Put("secagg_client", tag + "edited_request",
        ClientProgram(c, 0, ClientOp::kEditedUnmask, std::string("\x00\x02\x01\x00", 4)));
    std::string combined{static_cast<char>(c),
                         '\x01',
                         static_cast<char>(ClientOp::kAdvertise),
                         static_cast<char>(ClientOp::kShareKeys),
                         static_cast<char>(ClientOp::kCheckShares),
                         static_cast<char>(ClientOp::kReceiveChecked),
                         static_cast<char>(ClientOp::kReceiveConfirmations),
                         static_cast<char>(ClientOp::kMaskInput),
                         '\x00',
                         '\x03'};
    Put("secagg_client", tag + "short_input", combined);
  }
  Put("secagg_client", "config0_edited_survivors",
      ClientProgram(0, 2, ClientOp::kEditedSignSurvivors, std::string("\x00\x03\x00\x05", 4)));
  // Client 2 asked to sign a survivor list without itself (erase position 2).
  Put("secagg_client", "config0_survivors_omit_self",
      ClientProgram(0, 2, ClientOp::kEditedSignSurvivors, std::string("\x00\x01\x02", 3)));
  // Client 0 given a checked list without itself (erase position 0).
  Put("secagg_client", "config0_checked_omits_self",
      ClientProgram(0, 0, ClientOp::kEditedReceiveChecked, std::string("\x00\x01\x00", 3)));
  // Survivor 1 copied into the dropped list: in both lists.
  Put("secagg_client", "config0_request_both_lists",
      ClientProgram(0, 0, ClientOp::kEditedUnmask, std::string("\x00\x02\x01\x01\x00", 5)));
  Put("secagg_client", "out_of_order",
      std::string{'\0', '\0', static_cast<char>(ClientOp::kUnmask),
                  static_cast<char>(ClientOp::kShareKeys), static_cast<char>(ClientOp::kAdvertise),
                  static_cast<char>(ClientOp::kMaskInput),
                  static_cast<char>(ClientOp::kAdvertise)});
}

// The honest messages of both recorded rounds as they travel: the sender's
// index (the harness's first byte), then the serialized header.
void SecAggWire() {
  auto put = [](const std::string& name, uint32_t from, const wire::Header& h) {
    Put("secagg_wire", name, std::string(1, static_cast<char>(from)) + h.SerializeAsString());
  };
  for (int c = 0; c < kNumConfigs; ++c) {
    const HonestRound& h = GetHonestRound(c);
    const std::string tag = "config" + std::to_string(c) + "_";
    const auto& [signer, signature] = *h.signatures.begin();
    const auto& [responder, response] = *h.responses.begin();
    const auto& [recipient, request] = *h.requests.begin();
    put(tag + "seed_commit", 1, aggregation::ToWire(1, 2, h.commits[1]));
    put(tag + "seed_root", 0, aggregation::ToWire(1, 2, h.seed_roots.begin()->second));
    put(tag + "confirmation", 1, aggregation::ToWire(1, 2, h.confirmations[1]));
    put(tag + "confirmations", 0, aggregation::ToWire(1, 2, h.confirmed.begin()->second));
    put(tag + "advert", 1, aggregation::ToWire(1, 2, h.adverts[1]));
    put(tag + "key_list", 0, aggregation::ToWire(1, 2, h.key_lists.begin()->second));
    put(tag + "sealed", 1, aggregation::ToWire(1, 2, h.sealed[1]));
    put(tag + "inbound", 0, aggregation::ToWire(1, 2, h.inbound.begin()->second));
    put(tag + "share_check", 2, aggregation::ToWire(1, 2, h.checks[2]));
    put(tag + "signature", signer, aggregation::ToWire(1, 2, signature));
    put(tag + "request", recipient, aggregation::ToWire(1, 2, request));
    put(tag + "response", responder, aggregation::ToWire(1, 2, response));
    wire::Header checked, survivors;
    checked.set_version(wire::VERSION_1);
    for (uint32_t m : h.checked.members) checked.mutable_secagg_checked()->add_members(m);
    survivors.set_version(wire::VERSION_1);
    for (uint32_t m : h.survivors.survivors) survivors.mutable_secagg_survivors()->add_survivors(m);
    put(tag + "checked", 0, checked);
    put(tag + "survivors", 0, survivors);
  }
  // A complaint with a point and a proof, of the sizes a true one has.
  aggregation::ShareCheck complaint{3, {{1, std::array<uint8_t, crypto::kEncPointBytes>{}, {}}}};
  put("complaint_with_point", 3, aggregation::ToWire(1, 2, complaint));
}

}  // namespace
}  // namespace cohort::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  cohort::fuzz::g_root = argv[1];
  cohort::fuzz::Envelopes();
  cohort::fuzz::Configs();
  cohort::fuzz::Shards();
  cohort::fuzz::Idx();
  cohort::fuzz::Csv();
  cohort::fuzz::SecAggServer();
  cohort::fuzz::SecAggClient();
  cohort::fuzz::SecAggWire();
  return 0;
}
