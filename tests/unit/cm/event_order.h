// The order of one connection's rdma_cm events that the CM state machine allows, as a checker:
// shared by the CM tests (cm_link.h) and the CM manager's fuzz target, which has no GoogleTest.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cm/manager.h"

namespace urdma::cm::test {

// Checks that each connection's events come in an order the state machine allows:
// request → (connect response) → established → disconnected → timewait exit, where a
// rejection, an unreachable peer or a SIDR answer ends the story.
class EventOrder {
 public:
  // Returns "" or what was wrong.
  std::string add(const Event& e) {
    auto& seen = seen_[e.id];
    const int r = rank(e.type);
    if (!seen.empty()) {
      const EventType last = seen.back();
      if (last == EventType::kRejected || last == EventType::kUnreachable ||
          last == EventType::kSidrResponse || last == EventType::kTimewaitExit)
        return bad(e, "after a final event");
      if (last == EventType::kDisconnected && e.type != EventType::kTimewaitExit)
        return bad(e, "after disconnected");
      if (rank(last) >= r) return bad(e, "out of order");
    }
    seen.push_back(e.type);
    return "";
  }

 private:
  static int rank(EventType t) {
    switch (t) {
      case EventType::kConnectRequest:
      case EventType::kSidrRequest:
        return 0;
      case EventType::kConnectResponse:
        return 1;
      case EventType::kEstablished:
        return 2;
      case EventType::kRejected:
      case EventType::kUnreachable:
      case EventType::kDisconnected:
      case EventType::kSidrResponse:
        return 3;
      case EventType::kTimewaitExit:
        return 4;
    }
    return 5;
  }
  std::string bad(const Event& e, const char* why) {
    std::string s = std::string(event_name(e.type)) + " " + why + " for id " +
                    std::to_string(e.id) + "; before:";
    for (EventType t : seen_[e.id]) s += std::string(" ") + std::string(event_name(t));
    return s;
  }
  std::map<ConnId, std::vector<EventType>> seen_;
};

}  // namespace urdma::cm::test
