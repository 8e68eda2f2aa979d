#include "wire/cm.h"

#include <algorithm>
#include <iterator>

namespace urdma::wire {
namespace {

// One row per CM attribute: the whole CM vocabulary in one place.
struct CmAttrInfo {
  CmAttr attr;
  std::string_view name;
  bool is_query;  // ClassPortInfo: Get/Set/GetResp; every message: Send (IBA 12.6)
  size_t private_data_size;
  CmView (*make)(std::span<const uint8_t, kMadSize> mad);
};

template <typename View>
constexpr CmAttrInfo row(std::string_view name) {
  return {View::kAttr, name, View::kAttr == CmAttr::kClassPortInfo, View::kPrivateDataSize,
          [](std::span<const uint8_t, kMadSize> mad) -> CmView { return View(mad); }};
}

constexpr CmAttrInfo kCmAttrs[] = {
    row<CmClassPortInfoView>("ClassPortInfo"),
    row<CmReqView>("REQ"),
    row<CmMraView>("MRA"),
    row<CmRejView>("REJ"),
    row<CmRepView>("REP"),
    row<CmRtuView>("RTU"),
    row<CmDreqView>("DREQ"),
    row<CmDrepView>("DREP"),
    row<CmSidrReqView>("SIDR_REQ"),
    row<CmSidrRepView>("SIDR_REP"),
    row<CmLapView>("LAP"),
    row<CmAprView>("APR"),
};
static_assert(std::size(kCmAttrs) == std::variant_size_v<CmView>);

// Private-data sizes as Linux ib_cm.h (IB_CM_*_PRIVATE_DATA_SIZE) has them.
static_assert(CmReq::kPrivateDataSize == 92);
static_assert(CmMra::kPrivateDataSize == 222);
static_assert(CmRej::kPrivateDataSize == 148);
static_assert(CmRep::kPrivateDataSize == 196);
static_assert(CmRtu::kPrivateDataSize == 224);
static_assert(CmDreq::kPrivateDataSize == 220);
static_assert(CmDrep::kPrivateDataSize == 224);
static_assert(CmSidrReq::kPrivateDataSize == 216);
static_assert(CmSidrRep::kPrivateDataSize == 136);
static_assert(CmLap::kPrivateDataSize == 168);
static_assert(CmApr::kPrivateDataSize == 148);

const CmAttrInfo* find_attr(uint16_t attribute_id) {
  const auto* it = std::find_if(std::begin(kCmAttrs), std::end(kCmAttrs), [&](const auto& a) {
    return static_cast<uint16_t>(a.attr) == attribute_id;
  });
  return it == std::end(kCmAttrs) ? nullptr : it;
}

struct NamedCode {
  uint16_t code;
  std::string_view name;
};

template <size_t N>
std::string_view find_name(const NamedCode (&table)[N], uint16_t code) {
  const auto* it = std::find_if(std::begin(table), std::end(table),
                                [&](const auto& e) { return e.code == code; });
  return it == std::end(table) ? "unknown" : it->name;
}

constexpr NamedCode kRejReasons[] = {
    {1, "no QP"},
    {2, "no EEC"},
    {3, "no resources"},
    {4, "timeout"},
    {5, "unsupported request"},
    {6, "invalid communication ID"},
    {7, "invalid communication instance"},
    {8, "invalid service ID"},
    {9, "invalid transport service type"},
    {10, "stale connection"},
    {11, "RDC does not exist"},
    {12, "primary remote port GID rejected"},
    {13, "primary remote port LID rejected"},
    {14, "invalid primary SL"},
    {15, "invalid primary traffic class"},
    {16, "invalid primary hop limit"},
    {17, "invalid primary packet rate"},
    {18, "alternate remote port GID rejected"},
    {19, "alternate remote port LID rejected"},
    {20, "invalid alternate SL"},
    {21, "invalid alternate traffic class"},
    {22, "invalid alternate hop limit"},
    {23, "invalid alternate packet rate"},
    {24, "port CM redirection"},
    {25, "port redirection"},
    {26, "invalid path MTU"},
    {27, "insufficient responder resources"},
    {28, "consumer reject"},
    {29, "invalid RNR retry count"},
    {30, "duplicate local communication ID"},
    {31, "unsupported class version"},
    {32, "invalid primary flow label"},
    {33, "invalid alternate flow label"},
    {35, "vendor option not supported"},
};
static_assert(static_cast<uint16_t>(CmRejReason::kVendorOptionNotSupported) == 35);

constexpr NamedCode kSidrStatuses[] = {
    {0, "success"},  {1, "service ID not supported"}, {2, "rejected"}, {3, "no QP"},
    {4, "redirect"}, {5, "unsupported version"},
};

}  // namespace

std::string_view cm_message_name(uint16_t attribute_id) {
  const CmAttrInfo* a = find_attr(attribute_id);
  return a ? a->name : "unknown";
}

size_t cm_private_data_size(uint16_t attribute_id) {
  const CmAttrInfo* a = find_attr(attribute_id);
  return a ? a->private_data_size : 0;
}

std::string_view cm_rej_reason_name(uint16_t reason) {
  return find_name(kRejReasons, reason);
}
std::string_view cm_sidr_status_name(uint8_t status) {
  return find_name(kSidrStatuses, status);
}

CmParse parse_cm(std::span<const uint8_t> mad) {
  const MadParse m = parse_mad(mad);
  if (!m.ok()) return {m.error, {}};
  // parse_mad admits only the CM class (the one class urdma implements).
  const CmAttrInfo* a = find_attr(m.header.attribute_id());
  if (a == nullptr) return {MadError::kUnknownAttribute, {}};
  // IBA 12.6: every CM message is sent with the Send method; ClassPortInfo is queried with
  // Get/Set and answered with GetResp (IBA 13.4.8.1).
  const uint8_t method = m.header.method();
  const bool method_ok = a->is_query ? (method == static_cast<uint8_t>(MadMethod::kGet) ||
                                        method == static_cast<uint8_t>(MadMethod::kSet) ||
                                        method == static_cast<uint8_t>(MadMethod::kGetResp))
                                     : method == static_cast<uint8_t>(MadMethod::kSend);
  if (!method_ok) return {MadError::kUnsupportedMethod, {}};

  const CmView view = a->make(mad.first<kMadSize>());
  // REJ RejectInfoLength, APR and SIDR_REP AdditionalInformationLength count bytes of a 72-byte
  // area (IBA 12.6); a larger value cannot be honoured.
  const MadError check = std::visit(
      [](const auto& v) {
        if constexpr (requires { v.check(); }) {
          return v.check();
        } else {
          return MadError::kOk;
        }
      },
      view);
  if (check != MadError::kOk) return {check, {}};
  return {MadError::kOk, {a->attr, m.header, view}};
}

}  // namespace urdma::wire
