// Multicast attachments; see mcast_table.h.
#include "provider/mcast_table.h"

#include <algorithm>
#include <cstring>

#include "provider/limits.h"

namespace urdma::provider {

namespace {

McastTable::Key key_of(const uint8_t* raw) {
  McastTable::Key k;
  std::memcpy(k.data(), raw, k.size());
  return k;
}

}  // namespace

bool gid_is_multicast(const ibv_gid& gid) {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid.raw, kMapped, sizeof kMapped) == 0) return (gid.raw[12] & 0xf0) == 0xe0;
  return gid.raw[0] == 0xff;  // RFC 4291 2.7
}

Status McastTable::attach(uint32_t qpn, const ibv_gid& gid, bool* added) {
  if (added) *added = false;
  if (!gid_is_multicast(gid)) return Status(EINVAL);
  std::lock_guard lock(mutex_);
  const Key k = key_of(gid.raw);
  auto it = groups_.find(k);
  if (it != groups_.end() && std::ranges::find(it->second, qpn) != it->second.end()) return kOk;
  if (it == groups_.end() && groups_.size() >= kLimits.max_mcast_grp) return Status(ENOMEM);
  if (it != groups_.end() && it->second.size() >= kLimits.max_mcast_qp_attach)
    return Status(ENOMEM);
  if (total_ >= kLimits.max_total_mcast_qp_attach) return Status(ENOMEM);
  if (it == groups_.end()) it = groups_.emplace(k, std::vector<uint32_t>{}).first;
  it->second.push_back(qpn);
  ++total_;
  if (added) *added = true;
  return kOk;
}

Status McastTable::detach(uint32_t qpn, const ibv_gid& gid) {
  std::lock_guard lock(mutex_);
  const auto it = groups_.find(key_of(gid.raw));
  if (it == groups_.end()) return Status(EINVAL);
  const auto at = std::ranges::find(it->second, qpn);
  if (at == it->second.end()) return Status(EINVAL);
  it->second.erase(at);
  --total_;
  if (it->second.empty()) groups_.erase(it);
  return kOk;
}

std::vector<ibv_gid> McastTable::groups_of(uint32_t qpn) const {
  std::lock_guard lock(mutex_);
  std::vector<ibv_gid> out;
  for (const auto& [k, qpns] : groups_) {
    if (std::ranges::find(qpns, qpn) == qpns.end()) continue;
    ibv_gid g;
    std::memcpy(g.raw, k.data(), k.size());
    out.push_back(g);
  }
  return out;
}

bool McastTable::attached(uint32_t qpn) const {
  std::lock_guard lock(mutex_);
  for (const auto& [k, qpns] : groups_)
    if (std::ranges::find(qpns, qpn) != qpns.end()) return true;
  return false;
}

size_t McastTable::members(std::span<const uint8_t, 16> gid, std::span<uint32_t> out) const {
  std::lock_guard lock(mutex_);
  const auto it = groups_.find(key_of(gid.data()));
  if (it == groups_.end()) return 0;
  const size_t n = std::min(out.size(), it->second.size());
  std::copy_n(it->second.begin(), n, out.begin());
  return n;
}

size_t McastTable::size() const {
  std::lock_guard lock(mutex_);
  return total_;
}

}  // namespace urdma::provider
