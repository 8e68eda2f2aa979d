// Thread domains and parent domains: ibv_alloc_td / ibv_dealloc_td and ibv_alloc_parent_domain
// (ibv_dealloc_pd of a parent domain arrives here from verbs.cc).
//
// Design
// * A parent domain is a Pd wrapper whose `p` is its protection domain's provider PD (so every
//   verb taking an ibv_pd uses it as that PD: MRs, MWs, AHs, SRQs and QPs are created in the
//   protection domain) plus a ParentDomain: the protection domain, the thread domain, and a
//   QueueAllocator over the application's alloc/free callbacks.
// * The allocator is the one part that changes behaviour: a CQ (ibv_create_cq_ex with
//   IBV_CQ_INIT_ATTR_MASK_PD), QP or SRQ created under the parent domain takes its queue
//   buffers from it (provider/queue_memory.h): alloc(pd, pd_context, size, alignment,
//   resource_type), where pd is the parent domain and resource_type names the buffer (below).
//   A callback answering IBV_ALLOCATOR_USE_DEFAULT, or a parent domain without both callbacks,
//   means malloc, as in mlx5. Each such object holds a reference to the allocator, so
//   deallocating the parent domain while one lives is EBUSY, and a buffer is always freed
//   through the callbacks it came from, even after the parent domain is gone at close.
// * The callbacks run on the thread that creates, resizes or destroys the object, inside the
//   context's and the object table's locks: a callback must not create or destroy verbs objects
//   of the same context (it would wait for itself).
// * The parent domain holds a user of its protection domain (ibv_dealloc_pd of that PD is
//   EBUSY meanwhile) and counts in its thread domain's parent domains (ibv_dealloc_td EBUSY).
// * Resource types: rdma-core builds them from the provider's rdma_driver_id (upper 32 bits)
//   and a provider code. urdma has no kernel driver id, so the upper half is
//   RDMA_DRIVER_UNKNOWN (0); the codes follow mlx5's MLX5DV_RES_TYPE_* for the same buffers:
//   1 a QP's send queue, 2 a QP's own receive queue, 4 an SRQ, 5 a CQ
//   (docs/COMPATIBILITY.md lists them).
#include <cerrno>
#include <memory>
#include <utility>

#include "verbs/internal.h"

namespace urdma::verbs {

struct ParentDomain {
  Pd* protection;  // the PD this parent domain extends
  Td* td;          // or null
  // Always set (with or without callbacks): every CQ, QP and SRQ created under the domain
  // holds a copy, so use_count() - 1 is how many live.
  std::shared_ptr<provider::QueueAllocator> allocator;
};

namespace {

// RDMA_DRIVER_UNKNOWN: urdma has no rdma_driver_id of its own.
constexpr uint64_t kResourceTypeDriver = 0;

uint64_t resource_type(provider::QueueBuffer type) {
  return kResourceTypeDriver << 32 | static_cast<uint32_t>(type);
}

using AllocFn = void* (*)(ibv_pd*, void*, size_t, size_t, uint64_t);
using FreeFn = void (*)(ibv_pd*, void*, void*, uint64_t);

// The application's callbacks as the provider's QueueAllocator. Called on the thread that
// creates, resizes or destroys the object (never by the engine).
class AppAllocator final : public provider::QueueAllocator {
 public:
  AppAllocator(ibv_pd* domain, AllocFn alloc, FreeFn free, void* pd_context)
      : domain_(domain), alloc_(alloc), free_(free), pd_context_(pd_context) {}

  Allocation allocate(size_t bytes, size_t alignment, provider::QueueBuffer type) override {
    if (alloc_ == nullptr || free_ == nullptr) return {.ptr = nullptr, .use_default = true};
    void* p = alloc_(domain_, pd_context_, bytes, alignment, resource_type(type));
    if (p == IBV_ALLOCATOR_USE_DEFAULT) return {.ptr = nullptr, .use_default = true};
    return {.ptr = p, .use_default = false};
  }
  void release(void* ptr, provider::QueueBuffer type) override {
    free_(domain_, pd_context_, ptr, resource_type(type));
  }

 private:
  ibv_pd* const domain_;
  const AllocFn alloc_;
  const FreeFn free_;
  void* const pd_context_;
};

void free_td(void* p) {
  delete static_cast<Td*>(p);
}

ibv_td* op_alloc_td(ibv_context* context, ibv_td_init_attr* init_attr) {
  if (!context || !init_attr) return fail<ibv_td>(EINVAL);
  if (init_attr->comp_mask != 0) return fail<ibv_td>(EINVAL);  // no fields defined
  auto* w = new Td{};
  w->td.context = context;
  w->ctx = Context::from(context);
  remember_object(w->ctx, w, free_td);
  return &w->td;
}

int op_dealloc_td(ibv_td* td) {
  Td* w = Td::from(td);
  if (w->parent_domains.load() != 0) return EBUSY;
  forget_object(w->ctx, w);
  delete w;
  return 0;
}

ibv_pd* op_alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  if (!context || !attr || !attr->pd) return fail<ibv_pd>(EINVAL);
  constexpr uint32_t kKnown =
      IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  if (attr->comp_mask & ~kKnown) return fail<ibv_pd>(EINVAL);
  Pd* protection = Pd::from(attr->pd);
  // The PD must be this context's and a PD, not another parent domain.
  if (!same_device(attr->pd->context, context) || protection->domain) return fail<ibv_pd>(EINVAL);
  Td* td = attr->td ? Td::from(attr->td) : nullptr;
  if (td && !same_device(attr->td->context, context)) return fail<ibv_pd>(EINVAL);

  auto* w = new Pd{};
  w->p = protection->p;
  w->ctx = protection->ctx;
  w->pd.context = context;
  w->pd.handle = attr->pd->handle;
  const bool allocators = attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
  void* pd_context =
      (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) ? attr->pd_context : nullptr;
  w->domain = new ParentDomain{
      .protection = protection,
      .td = td,
      .allocator = std::make_shared<AppAllocator>(&w->pd, allocators ? attr->alloc : nullptr,
                                                  allocators ? attr->free : nullptr, pd_context)};
  w->p->add_user();
  if (td) td->parent_domains.fetch_add(1);
  remember_pd(w->ctx, w);
  return &w->pd;
}

}  // namespace

std::shared_ptr<provider::QueueAllocator> queue_allocator(ibv_pd* pd) {
  Pd* w = Pd::from(pd);
  return w->domain ? w->domain->allocator : nullptr;
}

int dealloc_parent_domain(Pd* w) {
  if (w->domain->allocator.use_count() > 1) return EBUSY;
  w->p->remove_user();
  if (w->domain->td) w->domain->td->parent_domains.fetch_sub(1);
  forget_object(w->ctx, w);
  free_parent_domain(w);
  delete w;
  return 0;
}

// Also at ibv_close_device, where the TD may be freed already: only the domain's own part.
void free_parent_domain(Pd* w) {
  delete w->domain;
  w->domain = nullptr;
}

void fill_domain_ops(verbs_context& v) {
  v.alloc_td = op_alloc_td;
  v.dealloc_td = op_dealloc_td;
  v.alloc_parent_domain = op_alloc_parent_domain;
}

}  // namespace urdma::verbs
