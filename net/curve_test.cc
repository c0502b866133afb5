#include "net/curve.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>

#include "net/zmq_codec.h"

namespace cohort::net {
namespace {

struct Party {
  crypto::Ed25519KeyPair identity;
  crypto::CurveKeys curve;
};

Party NewParty() {
  Party p;
  p.identity = std::move(crypto::GenerateEd25519()).value();
  p.curve = std::move(crypto::CurveKeysFor(p.identity)).value();
  return p;
}

std::string RawCurveKey(const Party& p) {
  const auto key = std::move(crypto::CurvePublicFor(p.identity.public_key)).value();
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

std::vector<std::string> Request(const std::string& mechanism, const std::string& credentials,
                                 const std::string& domain = kZapDomain) {
  return {"1.0", "7", domain, "127.0.0.1", "", mechanism, credentials};
}

TEST(ZapHandlerTest, AdmitsAllowlistedCurveKeysUnderTheirNameAndNothingElse) {
  zmq::context_t context;
  const Party alice = NewParty(), bob = NewParty();
  auto zap = ZapHandler::Create(context, {{"alice", alice.identity.public_key}});
  ASSERT_TRUE(zap.ok()) << zap.status();
  const ZapDecision ok = (*zap)->Decide(Request("CURVE", RawCurveKey(alice)));
  EXPECT_EQ(ok.status_code, "200");
  EXPECT_EQ(ok.user_id, "alice");
  for (const auto& request :
       {Request("CURVE", RawCurveKey(bob)), Request("NULL", ""), Request("PLAIN", "alice"),
        Request("CURVE", RawCurveKey(alice).substr(0, 31)),
        Request("CURVE", RawCurveKey(alice), "other-domain"),
        std::vector<std::string>{"1.0", "7", kZapDomain}}) {
    const ZapDecision d = (*zap)->Decide(request);
    EXPECT_EQ(d.status_code, "400") << d.status_text;
    EXPECT_TRUE(d.user_id.empty());
  }
}

TEST(ZapHandlerTest, AReplacedAllowlistRefusesTheKeysItDroppedAtOnce) {
  zmq::context_t context;
  const Party alice = NewParty(), bob = NewParty(), carol = NewParty();
  auto zap = ZapHandler::Create(
      context, {{"alice", alice.identity.public_key}, {"bob", bob.identity.public_key}});
  ASSERT_TRUE(zap.ok()) << zap.status();
  ASSERT_EQ((*zap)->Decide(Request("CURVE", RawCurveKey(bob))).status_code, "200");
  ASSERT_TRUE(
      (*zap)
          ->Replace({{"alice", alice.identity.public_key}, {"carol", carol.identity.public_key}})
          .ok());
  EXPECT_EQ((*zap)->size(), 2u);
  const ZapDecision revoked = (*zap)->Decide(Request("CURVE", RawCurveKey(bob)));
  EXPECT_EQ(revoked.status_code, "400");
  EXPECT_EQ(revoked.status_text, "key revoked");
  EXPECT_EQ((*zap)->Decide(Request("CURVE", RawCurveKey(carol))).user_id, "carol");
  EXPECT_EQ((*zap)->Decide(Request("CURVE", RawCurveKey(alice))).user_id, "alice");
  // Admitted again: no longer counted as revoked.
  ASSERT_TRUE((*zap)->Replace({{"bob", bob.identity.public_key}}).ok());
  EXPECT_EQ((*zap)->Decide(Request("CURVE", RawCurveKey(bob))).user_id, "bob");
  EXPECT_EQ((*zap)->Decide(Request("CURVE", RawCurveKey(carol))).status_text, "key revoked");
}

TEST(CurveTest, MalformedSecretKeyIsAnError) {
  zmq::context_t context;
  zmq::socket_t socket(context, zmq::socket_type::router);
  crypto::CurveKeys keys;
  keys.public_z85 = std::string(40, 'a');
  keys.secret_z85 = SecretBytes(41);
  std::memset(keys.secret_z85.bytes().data(), '~', 40);  // '~' is not a Z85 digit.
  EXPECT_EQ(SetUpCurveServer(socket, keys).code(), StatusCode::kInvalidArgument);
  keys.secret_z85 = SecretBytes(12);
  EXPECT_EQ(SetUpCurveServer(socket, keys).code(), StatusCode::kInvalidArgument);
}

// The first handshake outcome of `socket`'s connections, from a monitor.
class HandshakeWatch {
 public:
  HandshakeWatch(zmq::context_t& context, zmq::socket_t& socket, const std::string& name)
      : pair_(context, zmq::socket_type::pair) {
    const std::string endpoint = "inproc://handshake-watch-" + name;
    zmq_socket_monitor(socket.handle(), endpoint.c_str(),
                       ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
    pair_.connect(endpoint);
  }
  zmq::socket_t& socket() { return pair_; }
  // The event number, once one has arrived (call when socket() is readable).
  std::optional<uint16_t> Read() {
    zmq::message_t head, address;
    if (!pair_.recv(head, zmq::recv_flags::dontwait)) return std::nullopt;
    (void)pair_.recv(address);
    uint16_t event;
    std::memcpy(&event, head.data(), sizeof(event));
    return event;
  }

 private:
  zmq::socket_t pair_;
};

TEST(CurveTest, AnAllowlistedClientIsHeardUnderItsNameAnOtherKeyIsRefused) {
  zmq::context_t context;
  const Party server = NewParty(), alice = NewParty(), mallory = NewParty();
  auto zap = ZapHandler::Create(context, {{"alice", alice.identity.public_key}});
  ASSERT_TRUE(zap.ok()) << zap.status();
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  ASSERT_TRUE(SetUpCurveServer(router, server.curve).ok());
  router.bind("tcp://127.0.0.1:0");
  const std::string endpoint = LastEndpoint(router);
  const auto server_key = std::move(crypto::CurvePublicFor(server.identity.public_key)).value();

  zmq::socket_t evil(context, zmq::socket_type::dealer);
  evil.set(zmq::sockopt::linger, 0);
  ASSERT_TRUE(SetUpCurveClient(evil, mallory.curve, server_key).ok());
  HandshakeWatch evil_watch(context, evil, "mallory");
  evil.connect(endpoint);
  evil.send(zmq::str_buffer("from mallory"), zmq::send_flags::none);
  zmq::socket_t good(context, zmq::socket_type::dealer);
  good.set(zmq::sockopt::linger, 0);
  ASSERT_TRUE(SetUpCurveClient(good, alice.curve, server_key).ok());
  good.connect(endpoint);
  good.send(zmq::str_buffer("from alice"), zmq::send_flags::none);

  // Serve (answer ZAP, read the ROUTER) until Alice is heard and Mallory's
  // handshake has an outcome; bounded.
  std::vector<RawMessage> heard;
  std::optional<uint16_t> mallory_outcome;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((heard.empty() || !mallory_outcome) && std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                               {(*zap)->socket().handle(), 0, ZMQ_POLLIN, 0},
                               {evil_watch.socket().handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 3, std::chrono::milliseconds(100));
    if (items[1].revents & ZMQ_POLLIN) (*zap)->AnswerReady();
    if (items[2].revents & ZMQ_POLLIN) mallory_outcome = evil_watch.Read();
    RawMessage raw;
    while (TryReceive(router, true, raw)) heard.push_back(std::move(raw));
  }
  ASSERT_TRUE(mallory_outcome.has_value());
  EXPECT_EQ(*mallory_outcome, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  ASSERT_EQ(heard.size(), 1u);
  ASSERT_EQ(heard[0].frames.size(), 1u);
  EXPECT_EQ(heard[0].frames[0].to_string(), "from alice");
  EXPECT_EQ(heard[0].user_id, "alice");
  EXPECT_GE(heard[0].source_fd, 0);
  zmq_socket_monitor(evil.handle(), nullptr, 0);
}

}  // namespace
}  // namespace cohort::net
