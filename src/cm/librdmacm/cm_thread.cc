// The process CM's thread: it waits on the MAD channel, a wake-up eventfd and the Manager's next
// timer; feeds received GMPs and time to the Manager; sends what it produced as GMPs and turns its
// events into rdma_cm events (pump_locked, which the calls run too).

#include "cm/librdmacm/process.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "daemon/protocol.h"

namespace urdma::rdmacm {

// A new urdmad (a takeover, README "Takeover after a restart") knows the slot once this
// process's keeper has reattached it (daemon/client.h); until then the channel is refused
// (EPERM) and the CM thread tries again.
bool Cma::reopen_mad_channel() {
  urdma::daemon::Client fresh;
  std::string why;
  if (urdma::daemon::Client::connect_or_spawn({}, &fresh, &why) != 0) return false;
  if (fresh.open_mad_channel(slot_) != 0) return false;
  mad_channel_ = std::move(fresh);
  return true;
}

void Cma::loop() {
  // While urdmad is gone the Manager's timers still run (a REQ's retries, a DREQ's, TimeWait)
  // and the channel is reopened with back-off; MADs sent meanwhile are lost as on a lossy
  // fabric, and their senders' retries find the new channel.
  uint64_t reopen_at = 0;
  uint64_t reopen_backoff_ns = 20'000'000;
  for (;;) {
    if (!mad_channel_.connected() && clock_.now_ns() >= reopen_at) {
      if (reopen_mad_channel()) {
        reopen_backoff_ns = 20'000'000;
      } else {
        reopen_at = clock_.now_ns() + reopen_backoff_ns;
        reopen_backoff_ns = std::min<uint64_t>(reopen_backoff_ns * 2, 1'000'000'000);
      }
    }
    uint64_t deadline;
    {
      std::lock_guard lock(mu);
      deadline = manager->next_deadline_ns();
    }
    if (!mad_channel_.connected()) deadline = std::min(deadline, reopen_at);
    int timeout_ms = -1;
    if (deadline != urdma::net::kNever) {
      const uint64_t now = clock_.now_ns();
      timeout_ms = deadline <= now ? 0
                                   : static_cast<int>(std::min<uint64_t>(
                                         (deadline - now + 999'999) / 1'000'000, 60'000));
    }
    // A negative fd is skipped by poll: only the wake-up and the timers while the channel is down.
    pollfd fds[2] = {{mad_channel_.connected() ? mad_channel_.fd() : -1, POLLIN, 0},
                     {wake_fd_, POLLIN, 0}};
    const int r = poll(fds, 2, timeout_ms);
    if (r < 0 && errno != EINTR) return;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    bool hung_up = (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
    std::lock_guard lock(mu);
    while (mad_channel_.connected()) {
      urdma::daemon::MadDelivery info{};
      std::vector<uint8_t> dgram;
      const int e = mad_channel_.next_mad(&info, &dgram);
      if (e == ECONNRESET || e == EPIPE || e == ENOTCONN) hung_up = true;  // urdmad's end closed
      if (e != 0) break;  // none queued (EAGAIN), or a record we could not read: dropped
      receive_locked(info, dgram);
    }
    if (hung_up) {
      mad_channel_ = urdma::daemon::Client{};  // urdmad went away: reopen it (above)
      reopen_at = clock_.now_ns();
    }
    if (manager->next_deadline_ns() <= clock_.now_ns()) manager->run_timers();
    pump_locked();
  }
}

void Cma::receive_locked(const urdma::daemon::MadDelivery& info,
                         const std::vector<uint8_t>& dgram) {
  // The ICRC covers the addresses and ports that came with the MAD.
  const urdma::net::Endpoint src = urdma::daemon::mad_source(info);
  const auto gmp = urdma::gsi::check_gmp(dgram, src, urdma::daemon::mad_destination(info));
  if (!gmp) return;
  manager->receive(src.address.bytes(), gmp->src_qp, gmp->mad);
}

void Cma::send_mad_locked(const urdma::cm::OutgoingMad& m) {
  // From the address the kernel routes from toward the peer: the Manager's OutgoingMad names
  // only the destination. Lost (a full socket buffer, no route): the CM retransmits.
  (void)gmp_sender_->send(m.mad, urdma::net::Address(),
                          urdma::net::Endpoint{urdma::net::Address(m.dest_gid),
                                               urdma::net::kRoceV2UdpPort},
                          m.dest_qpn);
}

void Cma::pump_locked() {
  for (const urdma::cm::Event& ev : manager->take_events()) {
    using T = urdma::cm::EventType;
    if (ev.type == T::kConnectRequest || ev.type == T::kSidrRequest) {
      auto lit = listeners.find(ev.service_id);
      if (lit == listeners.end()) {
        manager->destroy(ev.id);
        continue;
      }
      // Linux cm_req_handler: a REQ whose path our GID table cannot carry — sent to a local
      // address that is no GID here (127.0.0.2: all of 127/8 reaches lo), or to one removed
      // meanwhile — is REJ "invalid GID" (12) with our GID 0 as ARI. Accepted, its QP would
      // answer from another address and both sides would end in RETRY_EXC_ERR.
      // A SIDR_REQ carries no path: its local address is the one rdma_cm's private data says
      // it was sent to. Linux answers one it cannot serve the same way (cma_ib_req_handler
      // fails, and cm_destroy_id rejects the SIDR request): SIDR_REP status 2, "reject".
      Gid local = ev.local_gid;
      if (ev.type == T::kSidrRequest && ev.ip)
        std::copy(ev.ip->dst_addr.begin(), ev.ip->dst_addr.end(), local.begin());
      uint8_t local_index = 0;
      const bool local_gid_known = find_gid_index(local, &local_index) == 0;
      if (ev.type == T::kConnectRequest && !local_gid_known) {
        ibv_gid gid0{};
        urdma::cm::RejectParams rej;
        rej.reason = static_cast<uint16_t>(urdma::wire::CmRejReason::kInvalidGid);
        if (ibv_query_gid(verbs, 1, 0, &gid0) == 0) rej.ari = std::span<const uint8_t>(gid0.raw);
        (void)manager->reject(ev.id, rej);
        continue;
      }
      if (ev.type == T::kSidrRequest && ev.ip && !local_gid_known) {
        urdma::cm::SidrAnswerParams no;
        no.status = static_cast<uint8_t>(urdma::wire::CmSidrStatus::kReject);
        (void)manager->sidr_answer(ev.id, no);
        continue;
      }
      Id* l = lit->second;
      auto* child = new Id();
      child->id.verbs = verbs;
      child->id.pd = device_pd();
      child->id.channel = l->id.channel;
      child->id.context = l->id.context;
      child->id.ps = l->id.ps;
      child->id.qp_type = l->id.qp_type;
      child->id.port_num = 1;
      child->chan = l->chan;
      if (l->sync) {
        auto* own = new Channel();
        own->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
        child->chan = own;
        child->id.channel = &own->ch;
        child->sync = true;
      }
      child->state = IdState::kRequest;
      child->has_conn = true;
      child->conn = ev.id;
      child->sgid = ev.local_gid;
      child->dgid = ev.remote_gid;
      uint16_t src_port = 0;
      if (ev.ip) {
        Gid s{}, d{};
        std::copy(ev.ip->src_addr.begin(), ev.ip->src_addr.end(), s.begin());
        std::copy(ev.ip->dst_addr.begin(), ev.ip->dst_addr.end(), d.begin());
        child->sgid = d;  // the request's destination is our address
        src_port = ev.ip->src_port;
        set_sockaddr(&child->id.route.addr.dst_storage, s, src_port);
      } else {
        set_sockaddr(&child->id.route.addr.dst_storage, ev.remote_gid, 0);
      }
      child->local_port = l->local_port;
      set_sockaddr(&child->id.route.addr.src_storage, child->sgid, l->local_port);
      child->sgid_index = local_index;  // found above (0 for a SIDR request without an address)
      set_route_path(child, urdma::cm::roce_flow_label(src_port, l->local_port));
      live.insert(child);
      by_conn[ev.id] = child;
      queue_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &ev, l);
      continue;
    }
    auto it = by_conn.find(ev.id);
    if (it == by_conn.end()) continue;
    Id* id = it->second;
    switch (ev.type) {
      case T::kSidrResponse:
        if (ev.sidr_status == 0) {
          id->state = IdState::kConnected;
          queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ev);
        } else {
          id->state = IdState::kDisconnected;
          queue_event(id, RDMA_CM_EVENT_UNREACHABLE, ev.sidr_status, &ev);
        }
        break;
      case T::kConnectResponse: {
        if (id->state != IdState::kConnecting) break;
        if (!id->id.qp) {  // the application moves its own QP, then calls rdma_establish
          queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &ev);
          break;
        }
        // Active side with rdma_create_qp's QP (librdmacm's ucma_process_conn_resp): move it
        // to RTR and RTS, then send the RTU. A QP that cannot move (the application put it in
        // ERR, say) ends in ERR with no RTU: CONNECT_ERROR, status -1; destroying the id then
        // sends the REJ (consumer defined) that tells the passive side.
        int err = 0;
        for (ibv_qp_state s : {IBV_QPS_RTR, IBV_QPS_RTS}) {
          auto q = manager->qp_attrs(ev.id, s);
          err = q.ok() ? apply_qp_locked(id, *q) : q.error();
          if (err != 0) break;
        }
        if (err == 0) err = manager->establish(ev.id).error();
        if (err == 0) {
          id->state = IdState::kConnected;
          report_up_locked(id);
          queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ev);
        } else {
          to_error_locked(id);
          id->state = IdState::kDisconnected;
          queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -1, &ev);
        }
        break;
      }
      case T::kEstablished:  // the passive side's RTU (its QP moved at rdma_accept)
        id->state = IdState::kConnected;
        report_up_locked(id);
        queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ev);
        break;
      case T::kRejected: {
        to_error_locked(id);
        id->state = IdState::kDisconnected;
        queue_event(id, RDMA_CM_EVENT_REJECTED, ev.reason, &ev);
        break;
      }
      case T::kUnreachable:
        to_error_locked(id);
        id->state = IdState::kDisconnected;
        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, &ev);
        break;
      case T::kDisconnected:
        // As Linux's rdma_cm: a DREQ (or DREP) leaves the QP alone — WRs in flight still
        // complete (the peer may disconnect the moment our WRITE's data lands, before its ACK
        // reached us); rdma_disconnect moves it to ERR.
        if (id->state == IdState::kConnected || id->state == IdState::kRequest ||
            id->state == IdState::kConnecting) {
          id->state = IdState::kDisconnected;
          queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0, &ev);
        }
        report_down_locked(id);
        break;
      case T::kTimewaitExit:
        queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
        break;
      default:
        break;
    }
  }
  for (const urdma::cm::OutgoingMad& m : manager->take_outgoing()) send_mad_locked(m);
}

}  // namespace urdma::rdmacm
