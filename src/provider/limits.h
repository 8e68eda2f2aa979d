// Device limits: the one table of every bound the provider core enforces.
//
// Design: values are at least Linux rxe's (drivers/infiniband/sw/rxe/rxe_param.h, kernel 6.1)
// wherever the device can honour them. Tables and queues cost memory for what is used, not for
// the bound (ObjectTable and MrTable grow in chunks; rings are allocated but not touched), so
// the bounds are rxe's; the exceptions are max_qp, which is the process's share of the host's
// QPN space, and max_cqe, which is ConnectX's (see below). `Device` reports these through
// ibv_query_device/ibv_query_port; every create/modify verb checks against them.
#pragma once

#include <cstddef>
#include <cstdint>

#include <infiniband/verbs.h>

namespace urdma::provider {

struct DeviceLimits {
  // Object tables.
  uint32_t max_pd;
  uint32_t max_qp;
  uint32_t max_cq;
  uint32_t max_mr;
  uint32_t max_mw;
  uint32_t max_srq;
  uint32_t max_xrcd;
  uint32_t max_ah;
  uint32_t max_dm;  // device memory allocations (the bytes: device_memory.h's kMaxDmBytes)
  // Multicast (mcast_table.h): groups, QPs per group, attachments in all.
  uint32_t max_mcast_grp;
  uint32_t max_mcast_qp_attach;
  uint32_t max_total_mcast_qp_attach;
  // Queue sizes (entries, as requested by the consumer; rings round up to 2^k - 1).
  uint32_t max_qp_wr;
  uint32_t max_cqe;
  uint32_t max_srq_wr;
  // Scatter/gather and inline.
  uint32_t max_sge;
  uint32_t max_sge_rd;
  uint32_t max_srq_sge;
  uint32_t max_inline_data_bytes;
  // RDMA READ / ATOMIC resources (IBA 9.5 / 11.2.1.2).
  uint32_t max_qp_rd_atom;       // outstanding as requester (max_rd_atomic)
  uint32_t max_qp_init_rd_atom;  // outstanding as responder (max_dest_rd_atomic)
  uint32_t max_res_rd_atom;
  // Memory.
  uint64_t max_mr_size_bytes;
  uint64_t page_size_cap;
  uint32_t max_msg_size_bytes;
  // Port.
  uint32_t gid_table_len;
  uint16_t pkey_table_len;     // only index 0 (default P_Key 0xFFFF) exists
  uint8_t local_ca_ack_delay;  // IBA 14.2.5.6: 4.096 us * 2^15 like rxe
};

inline constexpr DeviceLimits kLimits = {
    .max_pd = 1u << 20,  // rxe RXE_MAX_PD
    // A slot's QPN range (urdmad gives each process 4096 QPNs of the 24-bit space, steered by
    // DestQP), and the doorbell bitmap (engine/rung_qps.h). rxe: 2^20 - 16.
    .max_qp = 4096,
    .max_cq = 1u << 20,
    .max_mr = (1u << 19) - 1,  // rxe RXE_MAX_MR: indices 1..2^19 - 1
    .max_mw = (1u << 19) - 1,  // handles after the MRs'; with them, 1/16 of the 2^24 key tags
    .max_srq = 1u << 20,
    .max_xrcd = 1u << 16,  // ConnectX-5's 2^log_max_xrcd (24 would do; nobody needs more)
    .max_ah = (1u << 15) - 1,              // rxe RXE_MAX_AH
    .max_dm = 4096,                        // a DM is at least 4 bytes of 256 KiB; 4096 is plenty
    .max_mcast_grp = 8192,                 // rxe RXE_MAX_MCAST_GRP
    .max_mcast_qp_attach = 56,             // rxe RXE_MAX_MCAST_QP_ATTACH
    .max_total_mcast_qp_attach = 0x70000,  // rxe RXE_MAX_TOT_MCAST_QP_ATTACH
    .max_qp_wr = 1u << 20,                 // rxe RXE_MAX_QP_WR
    // ConnectX's (mlx5 reports 2^22 - 1), not rxe's 2^15 - 1: libfabric's ofi_rxm asks for
    // (rx + tx size) x FI_UNIVERSE_SIZE = 262144 entries by default. The ring is malloc'd and
    // untouched until written (spsc_ring.h), so a full-size CQ costs 192 MiB of address space
    // and pages only as completions arrive.
    .max_cqe = (1u << 22) - 1,
    .max_srq_wr = 1u << 20,  // rxe RXE_MAX_SRQ_WR
    .max_sge = 32,           // rxe RXE_MAX_SGE
    .max_sge_rd = 32,
    .max_srq_sge = 27,             // rxe RXE_MAX_SRQ_SGE
    .max_inline_data_bytes = 512,  // rxe: 32 SGEs * 16 bytes of WQE space
    .max_qp_rd_atom = 128,         // rxe RXE_MAX_QP_RD_ATOM
    .max_qp_init_rd_atom = 128,
    .max_res_rd_atom = 0x3f80,
    .max_mr_size_bytes = ~uint64_t{0},
    .page_size_cap = 0xfffff000,     // rxe RXE_PAGE_SIZE_CAP
    .max_msg_size_bytes = 1u << 31,  // IBA 9.7.2: 2^31 bytes
    .gid_table_len = 1024,           // rxe RXE_PORT_GID_TBL_LEN; urdmad's table holds as many
    .pkey_table_len = 1,
    .local_ca_ack_delay = 15,
};

// The one physical port.
inline constexpr uint8_t kPortNum = 1;
// MR/MW keys: a 24-bit random tag above 8 key bits (IBA 10.6.3.1 leaves the layout to the CA;
// rxe splits at the same bit). mr_table.h has the rules.
inline constexpr unsigned kKeyBits = 8;
inline constexpr uint32_t kKeyByteMask = (1u << kKeyBits) - 1;
// QP attribute limits (IBA 11.2.4.2 / 9.7.5.2.8).
inline constexpr uint8_t kMaxRetryCnt = 7;
inline constexpr uint8_t kMaxRnrRetry = 7;  // 7 = infinite
inline constexpr uint8_t kMaxMinRnrTimer = 31;
inline constexpr uint8_t kMaxTimeout = 31;

// Fills ibv_device_attr / ibv_port_attr from kLimits and the device's own settings.
void fill_device_attr(ibv_device_attr& attr, uint64_t node_guid_be);
void fill_port_attr(ibv_port_attr& attr, ibv_mtu max_mtu, ibv_mtu active_mtu);

}  // namespace urdma::provider
