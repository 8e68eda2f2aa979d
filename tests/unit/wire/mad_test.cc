// Tests for src/wire/mad.*: the common MAD header and parse_mad.
#include "wire/mad.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace urdma::wire {
namespace {

using Mad = std::array<uint8_t, kMadSize>;

// A CM REQ header as Linux sends it (rxe-to-rxe.pcap frame 1), written out by hand.
constexpr std::array<uint8_t, 24> kLinuxReqHeader = {
    0x01, 0x07, 0x02, 0x03,                          // base, class CM, class version 2, Send
    0x00, 0x00, 0x00, 0x00,                          // status, class specific
    0x00, 0x00, 0x00, 0x02, 0xb2, 0xf2, 0xa0, 0x1c,  // transaction ID
    0x00, 0x10, 0x00, 0x00,                          // attribute REQ, reserved
    0x00, 0x00, 0x00, 0x00,                          // attribute modifier
};

Mad valid_cm_mad() {
  Mad m{};
  std::copy(kLinuxReqHeader.begin(), kLinuxReqHeader.end(), m.begin());
  return m;
}

TEST(MadConstants, Sizes) {
  EXPECT_EQ(kMadSize, 256u);
  EXPECT_EQ(kMadHeaderSize, 24u);
  EXPECT_EQ(kMadDataSize, 232u);
  EXPECT_EQ(MadHeader::kSize, 24u);
  EXPECT_EQ(kMgmtClassCm, 0x07);
  EXPECT_EQ(kCmClassVersion, 2);
  EXPECT_EQ(kMadGsiQKey, 0x80010000u);
}

TEST(MadHeader, ReadsLinuxHeader) {
  MadHeaderView h(kLinuxReqHeader);
  EXPECT_EQ(h.base_version(), 1);
  EXPECT_EQ(h.mgmt_class(), 0x07);
  EXPECT_EQ(h.class_version(), 2);
  EXPECT_EQ(h.method(), 0x03);
  EXPECT_FALSE(h.r());
  EXPECT_EQ(h.status(), 0);
  EXPECT_EQ(h.class_specific(), 0);
  EXPECT_EQ(h.transaction_id(), 0x00000002b2f2a01cULL);
  EXPECT_EQ(h.attribute_id(), 0x0010);
  EXPECT_EQ(h.reserved(), 0);
  EXPECT_EQ(h.attribute_modifier(), 0u);
}

// Each field written alone into zeroed bytes lands exactly where the hand-written array says.
TEST(MadHeader, FieldPositions) {
  struct Case {
    const char* name;
    void (*set)(MadHeader);
    std::vector<std::pair<size_t, uint8_t>> bytes;
  };
  const Case cases[] = {
      {"base_version", [](MadHeader h) { h.set_base_version(0xA1); }, {{0, 0xA1}}},
      {"mgmt_class", [](MadHeader h) { h.set_mgmt_class(0xB2); }, {{1, 0xB2}}},
      {"class_version", [](MadHeader h) { h.set_class_version(0xC3); }, {{2, 0xC3}}},
      {"method", [](MadHeader h) { h.set_method(0x7F); }, {{3, 0x7F}}},
      {"r", [](MadHeader h) { h.set_r(true); }, {{3, 0x80}}},
      {"status", [](MadHeader h) { h.set_status(0x1234); }, {{4, 0x12}, {5, 0x34}}},
      {"class_specific", [](MadHeader h) { h.set_class_specific(0x5678); }, {{6, 0x56}, {7, 0x78}}},
      {"transaction_id",
       [](MadHeader h) { h.set_transaction_id(0x0102030405060708ULL); },
       {{8, 1}, {9, 2}, {10, 3}, {11, 4}, {12, 5}, {13, 6}, {14, 7}, {15, 8}}},
      {"attribute_id", [](MadHeader h) { h.set_attribute_id(0xABCD); }, {{16, 0xAB}, {17, 0xCD}}},
      {"reserved", [](MadHeader h) { h.set_reserved(0xEEFF); }, {{18, 0xEE}, {19, 0xFF}}},
      {"attribute_modifier",
       [](MadHeader h) { h.set_attribute_modifier(0x89ABCDEF); },
       {{20, 0x89}, {21, 0xAB}, {22, 0xCD}, {23, 0xEF}}},
  };
  for (const Case& c : cases) {
    std::array<uint8_t, 24> got{};
    c.set(MadHeader(got));
    std::array<uint8_t, 24> want{};
    for (auto [off, b] : c.bytes) want[off] = b;
    EXPECT_EQ(got, want) << c.name;
  }
}

TEST(MadHeader, RoundTripBoundaries) {
  for (uint64_t v : {uint64_t{0}, ~uint64_t{0}}) {
    std::array<uint8_t, 24> buf{};
    MadHeader h(buf);
    h.set_base_version(static_cast<uint8_t>(v));
    h.set_mgmt_class(static_cast<uint8_t>(v));
    h.set_class_version(static_cast<uint8_t>(v));
    h.set_method(static_cast<uint8_t>(v));
    h.set_status(static_cast<uint16_t>(v));
    h.set_class_specific(static_cast<uint16_t>(v));
    h.set_transaction_id(v);
    h.set_attribute_id(static_cast<uint16_t>(v));
    h.set_attribute_modifier(static_cast<uint32_t>(v));
    MadHeaderView r = h;  // writable converts to read-only
    EXPECT_EQ(r.base_version(), static_cast<uint8_t>(v));
    EXPECT_EQ(r.mgmt_class(), static_cast<uint8_t>(v));
    EXPECT_EQ(r.class_version(), static_cast<uint8_t>(v));
    EXPECT_EQ(r.method(), static_cast<uint8_t>(v));
    EXPECT_EQ(r.r(), v != 0);
    EXPECT_EQ(r.status(), static_cast<uint16_t>(v));
    EXPECT_EQ(r.class_specific(), static_cast<uint16_t>(v));
    EXPECT_EQ(r.transaction_id(), v);
    EXPECT_EQ(r.attribute_id(), static_cast<uint16_t>(v));
    EXPECT_EQ(r.attribute_modifier(), static_cast<uint32_t>(v));
  }
}

TEST(MadHeader, ResponseBitIsPartOfMethod) {
  std::array<uint8_t, 24> buf{};
  MadHeader h(buf);
  h.set_method(static_cast<uint8_t>(MadMethod::kGet));
  h.set_r(true);
  EXPECT_EQ(h.method(), static_cast<uint8_t>(MadMethod::kGetResp));
  EXPECT_EQ(buf[3], 0x81);
}

TEST(ParseMad, AcceptsLinuxCmMad) {
  const Mad m = valid_cm_mad();
  const MadParse p = parse_mad(m);
  ASSERT_TRUE(p.ok()) << mad_error_name(p.error);
  EXPECT_EQ(p.header.data(), m.data());
  EXPECT_EQ(p.header.transaction_id(), 0x00000002b2f2a01cULL);
}

TEST(ParseMad, WrongLength) {
  const Mad m = valid_cm_mad();
  std::vector<uint8_t> longer(m.begin(), m.end());
  longer.push_back(0);
  EXPECT_EQ(parse_mad(std::span<const uint8_t>(m).first(255)).error, MadError::kWrongLength);
  EXPECT_EQ(parse_mad(longer).error, MadError::kWrongLength);
  EXPECT_EQ(parse_mad({}).error, MadError::kWrongLength);
  EXPECT_EQ(parse_mad(std::span<const uint8_t>(m).first(24)).error, MadError::kWrongLength);
}

TEST(ParseMad, BadBaseVersion) {
  for (uint8_t v : {0x00, 0x02, 0x80, 0xFF}) {
    Mad m = valid_cm_mad();
    m[0] = v;
    EXPECT_EQ(parse_mad(m).error, MadError::kBadBaseVersion) << int{v};
  }
}

TEST(ParseMad, UnknownClass) {
  // Known-but-unimplemented classes (SubnAdm, PerfMgmt, ...) and undefined ones alike.
  for (uint8_t c : {0x01, 0x03, 0x04, 0x06, 0x08, 0x81, 0x00, 0x7F, 0xFF}) {
    Mad m = valid_cm_mad();
    m[1] = c;
    EXPECT_EQ(parse_mad(m).error, MadError::kUnknownClass) << int{c};
  }
}

TEST(ParseMad, UnsupportedClassVersion) {
  for (uint8_t v : {0x00, 0x01, 0x03, 0xFF}) {
    Mad m = valid_cm_mad();
    m[2] = v;
    EXPECT_EQ(parse_mad(m).error, MadError::kUnsupportedClassVersion) << int{v};
  }
}

TEST(ParseMad, ChecksInOrderLengthBaseClassVersion) {
  Mad m = valid_cm_mad();
  m[0] = 9;  // bad base version and
  m[1] = 9;  // unknown class: the base version is reported first
  EXPECT_EQ(parse_mad(m).error, MadError::kBadBaseVersion);
  m[0] = 1;
  m[2] = 9;
  EXPECT_EQ(parse_mad(m).error, MadError::kUnknownClass);
}

TEST(InitCmMad, WritesHeaderAndZeroesRest) {
  Mad m;
  m.fill(0xEE);
  const MadHeader h = init_cm_mad(m, MadMethod::kSend, 0x0010, 0x00000002b2f2a01cULL);
  EXPECT_EQ(h.data(), m.data());
  EXPECT_TRUE(std::equal(kLinuxReqHeader.begin(), kLinuxReqHeader.end(), m.begin()));
  EXPECT_TRUE(std::all_of(m.begin() + 24, m.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(parse_mad(m).ok());
}

TEST(MadNames, ErrorsHaveNamesAndStatuses) {
  EXPECT_EQ(mad_error_name(MadError::kOk), "ok");
  EXPECT_EQ(mad_error_name(MadError::kWrongLength), "wrong length");
  EXPECT_EQ(mad_error_name(MadError::kUnknownAttribute), "unknown attribute");
  EXPECT_EQ(mad_error_name(MadError::kPrivateDataTooLong), "private data too long");
  EXPECT_EQ(mad_error_status(MadError::kOk), 0x0000);
  EXPECT_EQ(mad_error_status(MadError::kBadBaseVersion), 0x0004);
  EXPECT_EQ(mad_error_status(MadError::kUnsupportedClassVersion), 0x0004);
  EXPECT_EQ(mad_error_status(MadError::kUnknownAttribute), 0x000C);
  EXPECT_EQ(mad_error_status(MadError::kInfoLengthTooLong), 0x001C);
}

TEST(MadNames, ClassesAndMethods) {
  EXPECT_EQ(mad_class_name(0x07), "CM");
  EXPECT_EQ(mad_class_name(0x03), "SubnAdm");
  EXPECT_EQ(mad_class_name(0x42), "unknown");
  EXPECT_EQ(mad_method_name(0x01), "Get");
  EXPECT_EQ(mad_method_name(0x03), "Send");
  EXPECT_EQ(mad_method_name(0x81), "GetResp");
  EXPECT_EQ(mad_method_name(0x55), "unknown");
}

}  // namespace
}  // namespace urdma::wire
