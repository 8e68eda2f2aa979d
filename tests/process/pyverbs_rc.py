#!/usr/bin/python3
"""pyverbs (Debian's python3-pyverbs, unmodified) on urdma: run by pyverbs_test.cc with
LD_LIBRARY_PATH naming the build's lib/ directory, so pyverbs' libibverbs.so.1 and
librdmacm.so.1 are ours.

Each mode prints what it observed as `name=value` lines for the test to assert on; a pyverbs
call that fails raises PyverbsRDMAError (with the errno) and the script exits non-zero.

  device  the device list, the device, port 1 and GID 0 as pyverbs' query calls return them
  rc      two RC QPs of this process joined by a GRH address: SEND with immediate, RDMA WRITE
          and RDMA WRITE with immediate of a 64 KiB buffer, checked by CRC-32; the receiving
          side waits for its completions on a completion channel (req_notify, get_cq_event)
  cm_server PORT, cm_client PORT
          pyverbs.cmid's synchronous RDMA CM on 127.0.0.1: the client connects to the server,
          each sends the other a 4 KiB message (the server once it printed "listening")
  tm_server DIR, tm_client DIR
          tag matching between two processes (the QP numbers exchanged as files in DIR): the
          server's RC QP is on a tag-matching SRQ and has no send queue; the client sends an
          eager message to a posted tag, one nobody posted (unexpected) and a rendezvous
          request whose data the server's engine reads; the client waits for the FIN
"""
import ipaddress
import os
import sys
import time
import zlib

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cmid import CMID, AddrInfo
from pyverbs.cq import CQ, CQEX, CompChannel, CqInitAttrEx, PollCqAttr
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD, ParentDomain, ParentDomainInitAttr
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.srq import SRQ, OpsWr, SrqInitAttrEx
from pyverbs.wr import SGE, RecvWR, SendWR
from pyverbs.xrcd import XRCD, XRCDInitAttr

SIZE = 64 * 1024
IMM = 0x1234ABCD
POLL_DEADLINE_S = 10


def say(name, value):
    print(f"{name}={value}", flush=True)


def gid_text(gid):
    """pyverbs prints a GID as eight groups of four hex digits; an IPv4-mapped one as
    ::ffff:a.b.c.d."""
    address = ipaddress.IPv6Address(str(gid))
    return f"::ffff:{address.ipv4_mapped}" if address.ipv4_mapped else str(address)


def device():
    say("devices", ",".join(d.name.decode() for d in get_device_list()))
    ctx = Context(name="urdma0")
    attr = ctx.query_device()
    for field in ("max_qp", "max_qp_wr", "max_cq", "max_cqe", "max_mr", "max_mr_size",
                  "max_pd", "max_sge", "phys_port_cnt"):
        say(field, getattr(attr, field))
    port = ctx.query_port(1)
    say("port_state", e.ibv_port_state(port.state).name)
    say("link_layer", port.link_layer)
    say("active_mtu", e.ibv_mtu(port.active_mtu).name)
    say("gid_tbl_len", port.gid_tbl_len)
    say("gid0", gid_text(ctx.query_gid(1, 0)))
    say("gid0_type", e.ibv_gid_type(ctx.query_gid_ex(1, 0).gid_type).name)
    say("ex_max_qp", ctx.query_device_ex().orig_attr.max_qp)
    say("hca_core_clock", ctx.query_device_ex().hca_core_clock)
    _, raw_clock = ctx.query_rt_values_ex()
    say("rt_values_ns", raw_clock)
    say("monotonic_ns", time.monotonic_ns())
    unsupported(ctx)
    ctx.close()


def unsupported(ctx):
    """Prints the errno of each call (0: it worked): a private XRC domain (fd -1) and a parent
    domain (without allocators) urdma makes."""
    pd = PD(ctx)
    calls = {
        "xrcd": lambda: XRCD(ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD |
                                               e.IBV_XRCD_INIT_ATTR_OFLAGS, os.O_CREAT,
                                               -1)).close(),
        "parent_domain": lambda: ParentDomain(ctx, ParentDomainInitAttr(pd=pd)),
    }
    for name, call in calls.items():
        try:
            call()
            say(f"{name}_errno", 0)
        except PyverbsRDMAError as error:
            say(f"{name}_errno", error.error_code)
    pd.close()


def poll_one(cq):
    """The next completion of `cq`; fails after POLL_DEADLINE_S rather than hanging."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while time.monotonic() < deadline:
        n, wcs = cq.poll(1)
        if n == 1:
            return wcs[0]
    sys.exit(f"no completion within {POLL_DEADLINE_S} s")


def say_wc(prefix, wc):
    say(f"{prefix}_status", wc.status)
    say(f"{prefix}_opcode", e.ibv_wc_opcode(wc.opcode).name)
    say(f"{prefix}_byte_len", wc.byte_len)
    say(f"{prefix}_wr_id", wc.wr_id)
    if wc.wc_flags & e.IBV_WC_WITH_IMM:
        say(f"{prefix}_imm", hex(wc.imm_data))


def rc_to_rts(qp, peer_qpn, gid, mtu, access):
    """An RC QP to RTS towards peer_qpn at `gid` (source GID index 0): PSNs 0, one READ in
    flight each way, 7 transport and 7 RNR retries."""
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = access
    attr.dest_qp_num = peer_qpn
    attr.path_mtu = mtu
    attr.rq_psn = 0
    attr.sq_psn = 0
    attr.max_dest_rd_atomic = 1
    attr.max_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1)
    qp.to_rts(attr)


class Side:
    """One RC QP with its own CQ (on `channel` if given) and a 64 KiB MR open to remote
    writes."""

    def __init__(self, ctx, pd, channel=None):
        access = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                  e.IBV_ACCESS_REMOTE_READ)
        self.mr = MR(pd, SIZE, access)
        self.channel = channel
        self.cq = CQ(ctx, 16, None, channel, 0)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        self.qp = QP(pd, init)

    def connect(self, peer, gid, mtu):
        rc_to_rts(self.qp, peer.qp.qp_num, gid, mtu,
                  e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)

    def sge(self):
        return SGE(self.mr.buf, SIZE, self.mr.lkey)

    def post_recv(self, wr_id):
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[self.sge()]))

    def post_send(self, wr_id, opcode, remote=None, imm=None):
        kwargs = {"imm_data": imm} if imm is not None else {}
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[self.sge()],
                    send_flags=e.IBV_SEND_SIGNALED, **kwargs)
        if remote is not None:
            wr.set_wr_rdma(remote.mr.rkey, remote.mr.buf)
        self.qp.post_send(wr)

    def crc(self):
        return zlib.crc32(self.mr.read(SIZE, 0))


def rc():
    ctx = Context(name="urdma0")
    pd = PD(ctx)
    channel = CompChannel(ctx)
    a, b = Side(ctx, pd), Side(ctx, pd, channel)
    gid = ctx.query_gid(1, 0)
    mtu = ctx.query_port(1).active_mtu
    a.connect(b, gid, mtu)
    b.connect(a, gid, mtu)
    say("qp_state", e.ibv_qp_state(a.qp.query(e.IBV_QP_STATE)[0].qp_state).name)

    steps = (("send_imm", e.IBV_WR_SEND_WITH_IMM, None, IMM, True),
             ("write", e.IBV_WR_RDMA_WRITE, b, None, False),
             ("write_imm", e.IBV_WR_RDMA_WRITE_WITH_IMM, b, IMM + 1, True))
    for n, (name, opcode, remote, imm, receives) in enumerate(steps, start=1):
        a.mr.write(os.urandom(SIZE), SIZE, 0)
        b.mr.write(bytes(SIZE), SIZE, 0)
        if receives:
            b.post_recv(100 + n)
            b.cq.req_notify()
        a.post_send(n, opcode, remote, imm)
        say_wc(f"{name}_sender", poll_one(a.cq))
        if receives:
            channel.get_cq_event(b.cq)
            b.cq.ack_events(1)
            say(f"{name}_receiver_event", 1)
            say_wc(f"{name}_receiver", poll_one(b.cq))
        say(f"{name}_crc_sent", a.crc())
        say(f"{name}_crc_received", b.crc())
    for side in (a, b):
        side.qp.close()
        side.cq.close()
        side.mr.close()
    channel.close()
    pd.close()
    ctx.close()


CM_MSG = 4096


def cm_qp_attr():
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    return QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap, sq_sig_all=1)


def cm_buffers(cmid):
    """A receive buffer, posted before the connection exists, and a send buffer."""
    recv_mr = cmid.reg_msgs(CM_MSG)
    send_mr = cmid.reg_msgs(CM_MSG)
    cmid.post_recv(recv_mr)
    return recv_mr, send_mr


def cm_exchange(cmid, role, recv_mr, send_mr, message):
    """Sends `message`, then reports both completions and the CRC of what arrived."""
    send_mr.write(message, CM_MSG, 0)
    cmid.post_send(send_mr)
    say_wc(f"{role}_send", cmid.get_send_comp())
    say_wc(f"{role}_recv", cmid.get_recv_comp())
    say(f"{role}_received_crc", zlib.crc32(recv_mr.read(CM_MSG, 0)))
    say(f"{role}_sent_crc", zlib.crc32(message))


def cm_message(role):
    """Each side's own bytes, so a message that came back to its sender would show."""
    return bytes((i * 7 + ord(role[0])) & 0xFF for i in range(CM_MSG))


def cm_server(port):
    info = AddrInfo(src="127.0.0.1", src_service=port, port_space=ce.RDMA_PS_TCP,
                    flags=ce.RAI_PASSIVE)
    listener = CMID(creator=info, qp_init_attr=cm_qp_attr())
    listener.listen()
    print("listening", flush=True)
    conn = listener.get_request()
    recv_mr, send_mr = cm_buffers(conn)
    conn.accept()
    say("server_device", conn.dev_name)
    cm_exchange(conn, "server", recv_mr, send_mr, cm_message("server"))
    conn.disconnect()
    conn.close()
    listener.close()


def cm_client(port):
    info = AddrInfo(dst="127.0.0.1", dst_service=port, port_space=ce.RDMA_PS_TCP)
    cmid = CMID(creator=info, qp_init_attr=cm_qp_attr())
    recv_mr, send_mr = cm_buffers(cmid)
    cmid.connect()
    cm_exchange(cmid, "client", recv_mr, send_mr, cm_message("client"))
    cmid.close()


TM_EAGER_LEN = 6000
TM_UNEXPECTED_LEN = 3000
TM_RNDV_LEN = 30000
TM_RNDV_OFFSET = 32768  # where the client's rendezvous data is
TM_TAG_EAGER, TM_TAG_RNDV, TM_TAG_NOBODY = 0x1111, 0x2222, 0x9999
TMH = 16


def publish(dirname, name, value):
    path = os.path.join(dirname, name)
    with open(path + ".tmp", "w") as f:
        f.write(str(value))
    os.rename(path + ".tmp", path)


def wait_for(dirname, name):
    deadline = time.monotonic() + 30
    path = os.path.join(dirname, name)
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} never appeared")
        time.sleep(0.01)
    with open(path) as f:
        return int(f.read())


def tm_connect(ctx, qp, peer_qpn):
    rc_to_rts(qp, peer_qpn, ctx.query_gid(1, 0), ctx.query_port(1).active_mtu,
              e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)


def poll_ex(cq):
    """One completion of an extended CQ as a dict (the tag from ibv_wc_read_tm_info)."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while cq.start_poll(PollCqAttr()) != 0:
        if time.monotonic() > deadline:
            raise TimeoutError("no completion")
    wc = {"status": cq.status, "wr_id": cq.wr_id, "opcode": cq.read_opcode(),
          "flags": cq.read_wc_flags(), "byte_len": cq.read_byte_len(),
          "tag": cq.read_tm_info().tag}
    cq.end_poll()
    return wc


def tm_header(mr, opcode, tag, offset=0):
    mr.write(bytes([opcode, 0, 0, 0]) + (0xC0DE).to_bytes(4, "big") + tag.to_bytes(8, "big"),
             TMH, offset)


def tm_server(dirname):
    ctx = Context(name="urdma0")
    pd = PD(ctx)
    cq = CQEX(ctx, CqInitAttrEx(cqe=64, wc_flags=e.IBV_WC_EX_WITH_TM_INFO |
                                e.IBV_WC_STANDARD_FLAGS))
    attr = SrqInitAttrEx(max_wr=16, max_sge=1)
    attr.comp_mask = (e.IBV_SRQ_INIT_ATTR_TYPE | e.IBV_SRQ_INIT_ATTR_PD |
                      e.IBV_SRQ_INIT_ATTR_CQ | e.IBV_SRQ_INIT_ATTR_TM)
    attr.srq_type = e.IBV_SRQT_TM
    attr.pd = pd
    attr.cq = cq
    attr.max_num_tags = 16
    attr.max_ops = 8
    srq = SRQ(ctx, attr)
    cap = QPCap(max_send_wr=0, max_recv_wr=0, max_send_sge=0, max_recv_sge=0)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=cap))
    mr = MR(pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE)
    publish(dirname, "server", qp.qp_num)
    tm_connect(ctx, qp, wait_for(dirname, "client"))
    # The unexpected message's ordinary buffer, then the two tagged buffers.
    srq.post_recv(RecvWR(wr_id=500, num_sge=1, sg=[SGE(mr.buf + 49152, 16384, mr.lkey)]))
    for wr_id, tag, offset, length in ((1, TM_TAG_EAGER, 0, 16384),
                                       (2, TM_TAG_RNDV, 16384, 32768)):
        srq.post_srq_ops(OpsWr(wr_id=wr_id, recv_wr_id=wr_id, num_sge=1, tag=tag,
                               mask=0xFFFFFFFFFFFFFFFF,
                               sg_list=[SGE(mr.buf + offset, length, mr.lkey)]))
        wc = poll_ex(cq)
        say(f"add{wr_id}_opcode", e.ibv_wc_opcode(wc["opcode"]).name)
    publish(dirname, "ready", 1)
    for name in ("eager", "unexpected", "rndv_match", "rndv_data"):
        wc = poll_ex(cq)
        for field in ("status", "wr_id", "flags", "byte_len", "tag"):
            say(f"{name}_{field}", wc[field])
        say(f"{name}_opcode", e.ibv_wc_opcode(wc["opcode"]).name)
    say("eager_crc", zlib.crc32(mr.read(TM_EAGER_LEN - TMH, 0)))
    say("unexpected_crc", zlib.crc32(mr.read(TM_UNEXPECTED_LEN, 49152)))
    say("rndv_crc", zlib.crc32(mr.read(TM_RNDV_LEN, 16384)))
    wait_for(dirname, "done")  # the FIN reached the client before this QP goes
    for obj in (qp, srq, mr, cq, pd, ctx):
        obj.close()


def tm_client(dirname):
    ctx = Context(name="urdma0")
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    mr = MR(pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
    fin = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    server_qpn = wait_for(dirname, "server")
    publish(dirname, "client", qp.qp_num)
    tm_connect(ctx, qp, server_qpn)
    qp.post_recv(RecvWR(wr_id=900, num_sge=1, sg=[SGE(fin.buf, 64, fin.lkey)]))
    wait_for(dirname, "ready")

    def send(length):
        qp.post_send(SendWR(wr_id=length, opcode=e.IBV_WR_SEND, num_sge=1,
                            sg=[SGE(mr.buf, length, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED))
        say_wc(f"send{length}", poll_one(cq))

    mr.write(os.urandom(SIZE), SIZE, 0)
    tm_header(mr, 3, TM_TAG_EAGER)  # IBV_TMH_EAGER
    say("eager_crc", zlib.crc32(mr.read(TM_EAGER_LEN - TMH, TMH)))
    send(TM_EAGER_LEN)
    tm_header(mr, 3, TM_TAG_NOBODY)
    say("unexpected_crc", zlib.crc32(mr.read(TM_UNEXPECTED_LEN, 0)))
    send(TM_UNEXPECTED_LEN)
    tm_header(mr, 1, TM_TAG_RNDV)  # IBV_TMH_RNDV, then the RVH
    mr.write((mr.buf + TM_RNDV_OFFSET).to_bytes(8, "big") + mr.rkey.to_bytes(4, "big") +
             TM_RNDV_LEN.to_bytes(4, "big"), 16, TMH)
    say("rndv_crc", zlib.crc32(mr.read(TM_RNDV_LEN, TM_RNDV_OFFSET)))
    send(64)
    say_wc("fin", poll_one(cq))
    header = fin.read(TMH, 0)
    say("fin_tmh_opcode", header[0])
    say("fin_tmh_tag", int.from_bytes(header[8:16], "big"))
    publish(dirname, "done", 1)
    for obj in (qp, mr, fin, cq, pd, ctx):
        obj.close()


def main():
    modes = {"device": device, "rc": rc, "cm_server": cm_server, "cm_client": cm_client,
             "tm_server": tm_server, "tm_client": tm_client}
    modes[sys.argv[1]](*sys.argv[2:])
    print("done", flush=True)


if __name__ == "__main__":
    main()
