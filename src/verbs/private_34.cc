// rdma-core's private ABI (IBVERBS_PRIVATE_34): the interface between libibverbs and its
// provider plugins (driver.h, not installed). Debian's libmlx5.so.1 and libefa.so.1 are linked
// into perftest with BIND_NOW and reference these symbols, so they must exist for those binaries
// to start beside our libibverbs. None of them is ever called for urdma0 (no provider plugin
// owns it): verbs_register_driver_34, called from the plugins' constructors, records nothing;
// everything else fails honestly (EOPNOTSUPP, or NULL with errno EOPNOTSUPP).
//
// This file deliberately does not include <infiniband/verbs.h>: the definitions only provide the
// symbols, with C linkage; their argument lists are ignored.
#include <cerrno>

extern "C" {

// A plugin announcing itself (its constructor): urdma0 is not a plugin's device.
void verbs_register_driver_34(const void*) {}
void verbs_set_ops(void*, const void*) {}
void verbs_uninit_context(void*) {}
void __verbs_log(void*, int, const char*, ...) {}
bool verbs_allow_disassociate_destroy(int, void*) { return false; }
void* _verbs_init_and_alloc_context(void*, int, unsigned long, unsigned long, unsigned) {
  errno = EOPNOTSUPP;
  return nullptr;
}
void* verbs_open_device(void*, void*) {
  errno = EOPNOTSUPP;
  return nullptr;
}

unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void*) { return num_attrs; }
int execute_ioctl() { return EOPNOTSUPP; }
int ibv_cmd_advise_mr() { return EOPNOTSUPP; }
int ibv_cmd_alloc_dm() { return EOPNOTSUPP; }
int ibv_cmd_alloc_mw() { return EOPNOTSUPP; }
int ibv_cmd_alloc_pd() { return EOPNOTSUPP; }
int ibv_cmd_attach_mcast() { return EOPNOTSUPP; }
int ibv_cmd_close_xrcd() { return EOPNOTSUPP; }
int ibv_cmd_create_ah() { return EOPNOTSUPP; }
int ibv_cmd_create_counters() { return EOPNOTSUPP; }
int ibv_cmd_create_cq() { return EOPNOTSUPP; }
int ibv_cmd_create_cq_ex() { return EOPNOTSUPP; }
int ibv_cmd_create_flow() { return EOPNOTSUPP; }
int ibv_cmd_create_flow_action_esp() { return EOPNOTSUPP; }
int ibv_cmd_create_qp() { return EOPNOTSUPP; }
int ibv_cmd_create_qp_ex() { return EOPNOTSUPP; }
int ibv_cmd_create_qp_ex2() { return EOPNOTSUPP; }
int ibv_cmd_create_rwq_ind_table() { return EOPNOTSUPP; }
int ibv_cmd_create_srq() { return EOPNOTSUPP; }
int ibv_cmd_create_srq_ex() { return EOPNOTSUPP; }
int ibv_cmd_create_wq() { return EOPNOTSUPP; }
int ibv_cmd_dealloc_mw() { return EOPNOTSUPP; }
int ibv_cmd_dealloc_pd() { return EOPNOTSUPP; }
int ibv_cmd_dereg_mr() { return EOPNOTSUPP; }
int ibv_cmd_destroy_ah() { return EOPNOTSUPP; }
int ibv_cmd_destroy_counters() { return EOPNOTSUPP; }
int ibv_cmd_destroy_cq() { return EOPNOTSUPP; }
int ibv_cmd_destroy_flow() { return EOPNOTSUPP; }
int ibv_cmd_destroy_flow_action() { return EOPNOTSUPP; }
int ibv_cmd_destroy_qp() { return EOPNOTSUPP; }
int ibv_cmd_destroy_rwq_ind_table() { return EOPNOTSUPP; }
int ibv_cmd_destroy_srq() { return EOPNOTSUPP; }
int ibv_cmd_destroy_wq() { return EOPNOTSUPP; }
int ibv_cmd_detach_mcast() { return EOPNOTSUPP; }
int ibv_cmd_free_dm() { return EOPNOTSUPP; }
int ibv_cmd_get_context() { return EOPNOTSUPP; }
int ibv_cmd_modify_cq() { return EOPNOTSUPP; }
int ibv_cmd_modify_flow_action_esp() { return EOPNOTSUPP; }
int ibv_cmd_modify_qp() { return EOPNOTSUPP; }
int ibv_cmd_modify_qp_ex() { return EOPNOTSUPP; }
int ibv_cmd_modify_srq() { return EOPNOTSUPP; }
int ibv_cmd_modify_wq() { return EOPNOTSUPP; }
int ibv_cmd_open_qp() { return EOPNOTSUPP; }
int ibv_cmd_open_xrcd() { return EOPNOTSUPP; }
int ibv_cmd_poll_cq() { return EOPNOTSUPP; }
int ibv_cmd_post_recv() { return EOPNOTSUPP; }
int ibv_cmd_post_send() { return EOPNOTSUPP; }
int ibv_cmd_post_srq_recv() { return EOPNOTSUPP; }
int ibv_cmd_query_context() { return EOPNOTSUPP; }
int ibv_cmd_query_device_any() { return EOPNOTSUPP; }
int ibv_cmd_query_mr() { return EOPNOTSUPP; }
int ibv_cmd_query_port() { return EOPNOTSUPP; }
int ibv_cmd_query_qp() { return EOPNOTSUPP; }
int ibv_cmd_query_srq() { return EOPNOTSUPP; }
int ibv_cmd_read_counters() { return EOPNOTSUPP; }
int ibv_cmd_reg_dm_mr() { return EOPNOTSUPP; }
int ibv_cmd_reg_dmabuf_mr() { return EOPNOTSUPP; }
int ibv_cmd_reg_mr() { return EOPNOTSUPP; }
int ibv_cmd_req_notify_cq() { return EOPNOTSUPP; }
int ibv_cmd_rereg_mr() { return EOPNOTSUPP; }
int ibv_cmd_resize_cq() { return EOPNOTSUPP; }
int ibv_read_ibdev_sysfs_file(char*, unsigned long, void*, const char*, ...) {
  errno = ENOENT;
  return -1;
}
int verbs_init_cq() { return EOPNOTSUPP; }

// Used by librdmacm and providers to resolve a RoCE destination MAC from the kernel's neighbour
// table; urdma sends over UDP sockets and never needs one.
int ibv_resolve_eth_l2_from_gid(void*, void*, unsigned char*, unsigned short*) { return -EOPNOTSUPP; }

}  // extern "C"
