#include "wire/mad.h"

#include <algorithm>
#include <cassert>

namespace urdma::wire {
namespace {

struct MadErrorInfo {
  MadError error;
  std::string_view name;
  uint16_t status;  // what a GSI responder reports for it (IBA 13.4.7)
};

// One row per MadError, in enum order.
constexpr MadErrorInfo kMadErrors[] = {
    {MadError::kOk, "ok", kMadStatusSuccess},
    {MadError::kWrongLength, "wrong length", kMadStatusInvalidAttrValue},
    {MadError::kBadBaseVersion, "bad base version", kMadStatusBadVersion},
    {MadError::kUnknownClass, "unknown management class", kMadStatusBadVersion},
    {MadError::kUnsupportedClassVersion, "unsupported class version", kMadStatusBadVersion},
    {MadError::kUnknownAttribute, "unknown attribute", kMadStatusUnsupportedMethodAttr},
    {MadError::kUnsupportedMethod, "method not allowed for attribute",
     kMadStatusUnsupportedMethodAttr},
    {MadError::kInfoLengthTooLong, "additional information length too long",
     kMadStatusInvalidAttrValue},
    {MadError::kPrivateDataTooLong, "private data too long", kMadStatusInvalidAttrValue},
};
static_assert(std::size(kMadErrors) == static_cast<size_t>(MadError::kPrivateDataTooLong) + 1);

constexpr bool errors_in_enum_order() {
  for (size_t i = 0; i < std::size(kMadErrors); ++i) {
    if (static_cast<size_t>(kMadErrors[i].error) != i) return false;
  }
  return true;
}
static_assert(errors_in_enum_order());

// IBA 13.4.4: management classes. `class_version` is the version urdma implements, 0 when it
// does not implement the class at all (it then answers nothing but may name it in logs).
struct MadClassInfo {
  uint8_t mgmt_class;
  std::string_view name;
  uint8_t class_version;
};
constexpr MadClassInfo kMadClasses[] = {
    {0x01, "SubnMgmt", 0},
    {0x81, "SubnMgmtDirectedRoute", 0},
    {0x03, "SubnAdm", 0},
    {0x04, "PerfMgmt", 0},
    {0x05, "BaseboardMgmt", 0},
    {0x06, "DevMgt", 0},
    {kMgmtClassCm, "CM", kCmClassVersion},
    {0x08, "SNMP", 0},
    {0x21, "CongestionMgmt", 0},
};

struct MadMethodInfo {
  uint8_t method;
  std::string_view name;
};
constexpr MadMethodInfo kMadMethods[] = {
    {static_cast<uint8_t>(MadMethod::kGet), "Get"},
    {static_cast<uint8_t>(MadMethod::kSet), "Set"},
    {static_cast<uint8_t>(MadMethod::kSend), "Send"},
    {static_cast<uint8_t>(MadMethod::kTrap), "Trap"},
    {static_cast<uint8_t>(MadMethod::kReport), "Report"},
    {static_cast<uint8_t>(MadMethod::kTrapRepress), "TrapRepress"},
    {static_cast<uint8_t>(MadMethod::kGetResp), "GetResp"},
    {static_cast<uint8_t>(MadMethod::kReportResp), "ReportResp"},
};

const MadClassInfo* find_class(uint8_t mgmt_class) {
  const auto* it = std::find_if(std::begin(kMadClasses), std::end(kMadClasses),
                                [&](const MadClassInfo& c) { return c.mgmt_class == mgmt_class; });
  return it == std::end(kMadClasses) ? nullptr : it;
}

const MadErrorInfo& error_info(MadError e) {
  const auto i = static_cast<size_t>(e);
  assert(i < std::size(kMadErrors));
  return kMadErrors[i];
}

}  // namespace

std::string_view mad_error_name(MadError e) {
  return error_info(e).name;
}
uint16_t mad_error_status(MadError e) {
  return error_info(e).status;
}

std::string_view mad_class_name(uint8_t mgmt_class) {
  const MadClassInfo* c = find_class(mgmt_class);
  return c ? c->name : "unknown";
}

std::string_view mad_method_name(uint8_t method) {
  const auto* it = std::find_if(std::begin(kMadMethods), std::end(kMadMethods),
                                [&](const MadMethodInfo& m) { return m.method == method; });
  return it == std::end(kMadMethods) ? "unknown" : it->name;
}

MadParse parse_mad(std::span<const uint8_t> mad) {
  // IBA 13.4.1: GMPs are exactly 256 bytes; anything else is not a MAD.
  if (mad.size() != kMadSize) return {MadError::kWrongLength, {}};
  MadHeaderView h(mad.first<kMadHeaderSize>());
  // IBA 13.4.2: BaseVersion 1 is the only MAD format of this spec.
  if (h.base_version() != kMadBaseVersion) return {MadError::kBadBaseVersion, {}};
  const MadClassInfo* c = find_class(h.mgmt_class());
  if (c == nullptr || c->class_version == 0) return {MadError::kUnknownClass, {}};
  // IBA 13.4.2: ClassVersion selects the class's format; urdma speaks one per class.
  if (h.class_version() != c->class_version) return {MadError::kUnsupportedClassVersion, {}};
  return {MadError::kOk, h};
}

MadHeader init_cm_mad(std::span<uint8_t, kMadSize> mad, MadMethod method, uint16_t attribute_id,
                      uint64_t transaction_id) {
  std::fill(mad.begin(), mad.end(), uint8_t{0});
  MadHeader h(mad.first<kMadHeaderSize>());
  h.set_base_version(kMadBaseVersion);
  h.set_mgmt_class(kMgmtClassCm);
  h.set_class_version(kCmClassVersion);
  h.set_method(static_cast<uint8_t>(method));
  h.set_transaction_id(transaction_id);
  h.set_attribute_id(attribute_id);
  return h;
}

}  // namespace urdma::wire
