#!/usr/bin/env python3
"""Writes the seed corpora of the daemon and CM fuzz targets (input formats documented at the
top of each target): daemon_fuzz.cc, client_fuzz.cc, mad_route_fuzz.cc, cm_manager_fuzz.cc.
Records of the urdmad protocol are host-endian (x86-64: little-endian); MADs big-endian.

usage: gen_daemon_cm_seeds.py tests/fuzz/corpus
"""
import os, struct, sys

root = sys.argv[1]

# ---- the urdmad protocol (daemon/protocol.h) ----------------------------------------------
MAGIC, VERSION = 0x75724d44, 2
(ACQUIRE, SLOT, QUERY_GIDS, GIDS, ERROR, QUERY_STATUS, STATUS, WATCH_GIDS, HELLO, OK, LISTEN,
 UNLISTEN, MAD_CHANNEL, MAD, QUERY_CLIENTS, CLIENTS, REPORT_COUNTERS, REATTACH, CONN_UP,
 CONN_DOWN) = range(1, 21)
EBUSY, EPROTO, EACCES = 16, 71, 13


def msg(mtype, body=b'', status=0, size=None, version=VERSION, magic=MAGIC):
    size = 16 + len(body) if size is None else size
    return struct.pack('<IHHIi', magic, version, mtype, size, status) + body


def v4mapped(a, b, c, d):
    return bytes(10) + b'\xff\xff' + bytes([a, b, c, d])


SID = 0x0106000000004e21  # rdma_cm TCP port space, port 20001


def slot_info(slot=1, count=4, base=0x5000, qpns=4096, gen=1, port=4791, family=10):
    return struct.pack('<IIIIIHH', slot, count, base, qpns, gen, port, family)


def status_info(**kw):
    f = dict(pid=100, slots=4, leased=1, clients=2, max_clients=1024, gids=2)
    f.update(kw)
    return struct.pack('<6I5QHHI6Q', f['pid'], f['slots'], f['leased'], f['clients'],
                       f['max_clients'], f['gids'], 3, 0, 5, 4, 0, 4791, 10, 30000, 7, 1, 0, 0,
                       0, 0)


def wire_gid(addr, index, ifindex=1, family=2, prefix=8, scope=254):
    return struct.pack('<16sIIBBBB', addr, index, ifindex, family, prefix, scope, 0)


def counter_report(qps=2):
    return struct.pack('<II16Q', qps, 0, *range(1, 17))


def client_entry(pid, comm, slot=0xFFFFFFFF, role=0, flags=0):
    return (struct.pack('<5IHH16sQQ', pid, 1000, slot, 0, 0, role, flags, comm, 1234, 0) +
            counter_report())


def clients_page(entries, total=None, first=0):
    total = len(entries) if total is None else total
    page = struct.pack('<QQ7IHHIII', 5000, 4026531840, total, first, len(entries), 0, 0, 1, 0, 1,
                       0, 1000, 1000, 0) + bytes(4)  # ClientsPage's tail padding
    return msg(CLIENTS, page + b''.join(entries))


def mad_delivery(datagram, src=v4mapped(10, 0, 0, 1), dst=v4mapped(10, 0, 0, 2)):
    return msg(MAD, struct.pack('<16s16sHHI', src, dst, 4791, 4791, len(datagram)) + datagram)


def conn_record(local, remote=0x11000001, qpn=0x1234, local_addr=v4mapped(127, 0, 0, 1),
                peer=v4mapped(127, 0, 0, 2)):
    return struct.pack('<IIII16s16s', local, remote, qpn, 0, local_addr, peer)


# ---- MADs (wire/cm.h) -----------------------------------------------------------------------
REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP, APR = range(0x10, 0x1B)


def mad(attr, fields=b'', tid=0x1234, method=3):
    hdr = struct.pack('>BBBBHHQHHI', 1, 7, 2, method, 0, 0, tid, attr, 0, 0)
    body = fields + bytes(232 - len(fields))
    return hdr + body


def req(local, sid=SID):
    # LocalCommID, reserved, ServiceID; then a plausible rdma_cm REQ's bytes are not needed.
    return mad(REQ, struct.pack('>IIQ', local, 0, sid))


def dreq(local, remote, qpn=0x40):
    return mad(DREQ, struct.pack('>IIBBBB', local, remote, qpn >> 16, (qpn >> 8) & 255, qpn & 255, 0))


def sidr_req(request, sid=SID):
    return mad(SIDR_REQ, struct.pack('>IHHQ', request, 0xFFFF, 0, sid))


def gmp(m, psn=0):
    """A UD SEND Only to QP1 (BTH, DETH, MAD) with an ICRC slot the target does not check."""
    bth = struct.pack('>BBHII', 0x64, 0, 0xFFFF, 1, (1 << 31) | psn)
    deth = struct.pack('>II', 0x80010000, 1)
    return bth + deth + m + bytes(4)


def write(corpus, seeds):
    out = os.path.join(root, corpus)
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)
    print(corpus, len(seeds), 'seeds')


# ---- daemon_fuzz: flags, then ctl(1) length(2, LE) bytes -----------------------------------
A_HELLO, B, B_HELLO = 1, 2, 4
FIX, STEP = 0x10, 0x20
RECONNECT, DATAGRAM = 0x80, 0xC0
FD_NETNS, FD_FILE, FD_UDP, FD_SLOT, FD_UTS, FD_TWO = (1 << 1, 2 << 1, 3 << 1, 4 << 1, 5 << 1,
                                                      6 << 1)


def rec(ctl, data):
    return bytes([ctl]) + struct.pack('<H', len(data)) + data


def on_a(data, extra=0):
    return rec(FIX | STEP | extra, data)


def on_b(data, extra=0):
    return rec(1 | FIX | STEP | extra, data)


def body(mtype, b=b''):
    # The harness writes magic, version and size (FIX): type and status count.
    return msg(mtype, b)


daemon = {
    'status': bytes([A_HELLO]) + on_a(body(QUERY_STATUS)),
    'no_hello': bytes([0]) + on_a(body(QUERY_STATUS)),
    'hello_uts': bytes([0]) + on_a(body(HELLO), FD_UTS),
    'hello_two_fds': bytes([0]) + on_a(body(HELLO), FD_TWO),
    'hello_file': bytes([0]) + on_a(body(HELLO), FD_FILE),
    'hello_twice': bytes([A_HELLO]) + on_a(body(HELLO), FD_NETNS),
    'wrong_version': bytes([A_HELLO]) + rec(STEP, msg(QUERY_STATUS, version=3)),
    'bad_size': bytes([A_HELLO]) + rec(STEP, msg(QUERY_STATUS, size=99)),
    'short_header': bytes([A_HELLO]) + rec(STEP, b'\x44\x4d\x72\x75\x02'),
    'acquire_query': bytes([A_HELLO]) + on_a(body(ACQUIRE)) + on_a(body(ACQUIRE)) +
        on_a(body(QUERY_GIDS)) + on_a(body(QUERY_CLIENTS, struct.pack('<II', 0, 0))) +
        on_a(body(REPORT_COUNTERS, counter_report())) + on_a(body(QUERY_STATUS)) +
        on_a(body(QUERY_CLIENTS, struct.pack('<II', 1, 0))),
    'acquire_with_fd': bytes([A_HELLO]) + on_a(body(ACQUIRE), FD_UDP),
    'listen': bytes([A_HELLO]) + on_a(body(LISTEN, struct.pack('<Q', SID))) +
        on_a(body(ACQUIRE)) + on_a(body(LISTEN, struct.pack('<Q', SID))) +
        on_a(body(LISTEN, struct.pack('<Q', SID))) + on_a(body(UNLISTEN, struct.pack('<Q', SID))) +
        on_a(body(UNLISTEN, struct.pack('<Q', SID))),
    'channel_req': bytes([A_HELLO | B | B_HELLO]) + on_a(body(ACQUIRE)) +
        on_a(body(LISTEN, struct.pack('<Q', SID))) + on_b(body(MAD_CHANNEL, struct.pack('<II', 0, 0))) +
        rec(DATAGRAM | FIX | STEP, req(0x0A000001)) + rec(DATAGRAM | FIX | STEP, sidr_req(0x0A000002)) +
        rec(DATAGRAM | FIX | STEP, dreq(0x0A000003, 0x00000005)),
    'channel_not_owner': bytes([A_HELLO | B | B_HELLO]) +
        on_b(body(MAD_CHANNEL, struct.pack('<II', 1, 0))),
    'conn_up_reclaim': bytes([A_HELLO | B | B_HELLO]) + on_a(body(ACQUIRE)) +
        on_b(body(MAD_CHANNEL, struct.pack('<II', 0, 0))) +
        on_a(body(CONN_UP, conn_record(0x000007))) + on_a(body(CONN_UP, conn_record(0x000008))) +
        on_a(body(CONN_DOWN, struct.pack('<II', 0x000008, 0))) +
        on_a(body(CONN_DOWN, struct.pack('<II', 0x000009, 0))) +
        rec(RECONNECT | STEP, b'\x01') + on_a(body(QUERY_STATUS)),
    'conn_up_no_slot': bytes([A_HELLO]) + on_a(body(CONN_UP, conn_record(0x01000007))),
    'reattach': bytes([A_HELLO]) + on_a(body(ACQUIRE)) + rec(RECONNECT | STEP, b'\x01') +
        on_a(body(REATTACH, slot_info(slot=0)), FD_SLOT) + on_a(body(ACQUIRE)),
    'reattach_wrong_fd': bytes([A_HELLO]) + on_a(body(ACQUIRE)) + rec(RECONNECT | STEP, b'\x01') +
        on_a(body(REATTACH, slot_info(slot=0)), FD_UDP),
    'watch_gids': bytes([A_HELLO | B | B_HELLO]) + on_b(body(WATCH_GIDS)) + on_b(body(QUERY_STATUS)),
    'no_listener_req': bytes([A_HELLO]) + rec(DATAGRAM | FIX | STEP, req(0x0A000001, 0x1234)) +
        rec(DATAGRAM | FIX | STEP, sidr_req(7, 0x1234)),
    'orphan_dreq': bytes([A_HELLO]) + rec(DATAGRAM | FIX | STEP, dreq(0x0B000001, 0x03000002)),
    'raw_datagram': bytes([A_HELLO]) + rec(DATAGRAM | 1 | STEP, gmp(req(5))) +
        rec(DATAGRAM | STEP, b'\x00' * 7),
    'unknown_type': bytes([A_HELLO]) + on_a(body(99)) + on_a(body(SLOT, slot_info())),
    'report_malformed': bytes([A_HELLO]) + on_a(body(REPORT_COUNTERS, b'\x01\x02')),
}
write('daemon', daemon)

# ---- client_fuzz: flags, then ctl(1) length(2, LE) bytes -----------------------------------
C_FIX, C_FD_UDP, C_FD_FILE, C_FD_TWO, C_UNSOLICITED = 1, 1 << 1, 2 << 1, 3 << 1, 8


def calls(op0, op1):
    return 1 | (op0 << 1) | (op1 << 4)


def crec(data, ctl=0, call=0):
    """A record; `call` (ctl bits 4-7) is the Client call made two calls after its own."""
    return bytes([ctl | (call << 4)]) + struct.pack('<H', len(data)) + data


ACQ, QGIDS, QSTATUS, QCLIENTS, REPORT, LISTEN_CALL, CONN_CALL, REATTACH_CALL, CHANNEL, WATCH = range(10)
gids = msg(GIDS, struct.pack('<II', 2, 0) + wire_gid(v4mapped(127, 0, 0, 1), 0) +
           wire_gid(bytes([0xfe, 0x80]) + bytes(13) + b'\x01', 1, 2, 10, 64, 253))
entries = [client_entry(10, b'ibv_rc_pingpong\0'), client_entry(11, b'sixteen-chars-ab', 1, 1, 2)]
client = {
    'slot_status': bytes([calls(ACQ, QSTATUS)]) +
        crec(msg(SLOT, slot_info()), C_FD_UDP, QCLIENTS) + crec(msg(STATUS, status_info()), 0, ACQ) +
        crec(clients_page(entries)) + crec(msg(ERROR, status=EBUSY)),
    'slot_without_fd': bytes([calls(ACQ, ACQ)]) + crec(msg(SLOT, slot_info())) +
        crec(msg(SLOT, slot_info()), C_FD_FILE),
    'gids': bytes([calls(QGIDS, QGIDS)]) + crec(gids) + crec(msg(GIDS, struct.pack('<II', 1025, 0))),
    'clients_pages': bytes([calls(QCLIENTS, QSTATUS)]) +
        crec(clients_page(entries[:1], total=2)) + crec(clients_page(entries[1:], total=2, first=1)) +
        crec(msg(STATUS, status_info())),
    'clients_bad_count': bytes([calls(QCLIENTS, QCLIENTS)]) +
        crec(msg(CLIENTS, struct.pack('<QQ7I', 1, 2, 33, 0, 33, 0, 0, 0, 0) + bytes(20))),
    'errors': bytes([calls(QSTATUS, ACQ)]) + crec(msg(ERROR, status=EBUSY)) +
        crec(msg(ERROR, status=-5)),
    'ok_listen_conn': bytes([calls(LISTEN_CALL, CONN_CALL)]) + crec(msg(OK)) + crec(msg(OK)) +
        crec(msg(OK)) + crec(msg(OK, b'\x00')),
    'mad_channel': bytes([calls(ACQ, QSTATUS)]) +
        crec(msg(SLOT, slot_info()), C_FD_UDP, CHANNEL) + crec(msg(STATUS, status_info()), 0, CHANNEL) +
        crec(msg(OK)) + crec(mad_delivery(gmp(req(5))), C_UNSOLICITED) +
        crec(mad_delivery(b'', src=bytes(16)), C_UNSOLICITED) +
        crec(msg(MAD, struct.pack('<16s16sHHI', bytes(16), bytes(16), 1, 1, 2000)), C_UNSOLICITED),
    'watch': bytes([calls(QGIDS, QSTATUS)]) + crec(gids, 0, WATCH) +
        crec(msg(STATUS, status_info()), 0, WATCH) + crec(gids) + crec(gids, C_UNSOLICITED) +
        crec(msg(GIDS, struct.pack('<II', 3, 0)), C_UNSOLICITED),
    'reattach': bytes([calls(ACQ, REATTACH_CALL)]) + crec(msg(SLOT, slot_info()), C_FD_UDP) +
        crec(msg(ERROR, status=EBUSY)),
    'report': bytes([calls(REPORT, QSTATUS)]) + crec(msg(STATUS, status_info())),
    'hello_refused': bytes([0]) + crec(msg(ERROR, status=EACCES)),
    'hello_wrong_type': bytes([0]) + crec(msg(OK)),
    'hello_with_fd': bytes([0]) + crec(msg(HELLO, struct.pack('<IIIHHQ', 1, 1, 0, 1, 0, 0)), C_FD_UDP),
    'fix_header': bytes([calls(QSTATUS, QSTATUS)]) +
        crec(struct.pack('<IHHIi', 0, 0, STATUS, 0, 0) + status_info(), C_FIX),
    'request_bodies': bytes([0]) + crec(msg(CONN_UP, conn_record(0x01000001))) +
        crec(msg(REPORT_COUNTERS, counter_report())) + crec(msg(REATTACH, slot_info())) +
        crec(msg(LISTEN, struct.pack('<Q', SID))) + crec(msg(MAD_CHANNEL, struct.pack('<II', 1, 0))) +
        crec(msg(QUERY_CLIENTS, struct.pack('<II', 5, 0))) +
        crec(msg(CONN_DOWN, struct.pack('<II', 0x01000001, 0))),
    'fd_on_status': bytes([calls(QSTATUS, QGIDS)]) + crec(msg(STATUS, status_info()), C_FD_FILE) +
        crec(gids, C_FD_UDP),
    'bad_magic': bytes([calls(QSTATUS, QSTATUS)]) + crec(msg(STATUS, status_info(), magic=0)) +
        crec(msg(STATUS, status_info(), version=1)),
    'cut_short': bytes([0]) + crec(msg(STATUS, status_info()), 0, 2 | 1) +
        crec(gids, C_FD_UDP, 6 | 1) + crec(msg(OK), 0, 4),
    # recv_record: a record with two fds comes back with both (the control buffer sized for
    # kMaxPassedFds = 1 holds two on x86-64), not as -EMSGSIZE: a bug of src/daemon/protocol.cc.
    'crash-recv-record-two-fds': bytes([0, C_FD_TWO, 0, 0]),
}
write('client', client)

# ---- mad_route_fuzz: opcode byte, operands (readers: little-endian) ------------------------


class W:
    def __init__(self):
        self.b = bytearray()

    def u8(self, v):
        self.b += bytes([v & 255]); return self

    def u16(self, v):
        self.b += struct.pack('<H', v & 0xFFFF); return self

    def u32(self, v):
        self.b += struct.pack('<I', v & 0xFFFFFFFF); return self

    def u64(self, v):
        self.b += struct.pack('<Q', v); return self

    def raw(self, data):
        self.b += data; return self


RAW, BUILT, CONN_UP_OP, CONN_DOWN_OP, RECLAIM, ADVANCE, FORGET, BULK_CONNS, BULK_REQS, DREP_OP = range(10)
ADDR_A, ADDR_B, ADDR_V6 = 0, 1, 2  # 10.0.0.1, 10.0.0.2, fd00::1


def ep(w, addr):
    return w.u8(addr).u8(0)  # port 4791


def comm(w, slot, low):  # comm_id_for_slot(slot, low % 8)
    return w.u8(slot).u8(low)


def built(w, kind, a_slot, a_low, b_slot, b_low, tid=0x55, sid_low=0x21, src=ADDR_A,
          dst=ADDR_B, listened=0, flip=0):
    w.u8(BUILT)
    ep(w, src); ep(w, dst)
    w.u8(kind).u64(tid)
    comm(w, a_slot, a_low); comm(w, b_slot, b_low)
    w.u8(0).u8(sid_low)  # service ID 0x0106000000000000 + sid_low
    w.u8(0)              # no body bytes
    w.u32(7)             # PSN
    w.u8(flip)           # < 0xC0: no flipped byte
    return w.u8(listened)


def conn_up(w, slot, low, remote=0x11000001, peer=ADDR_B):
    w.u8(CONN_UP_OP).u8(slot)
    comm(w, slot, low)
    w.u32(remote).u32(0x40)
    w.u8(ADDR_A).u8(peer)
    return w


K_REQ, K_MRA, K_REJ, K_REP, K_RTU, K_DREQ, K_DREP, K_SIDR_REQ, K_SIDR_REP, K_LAP, K_APR, K_CPI = range(12)
mad_route = {}
w = W()
conn_up(w, 1, 1); conn_up(w, 1, 2); conn_up(w, 2, 3); conn_up(w, 1, 1, remote=0x22)
w.u8(CONN_DOWN_OP).u8(1); comm(w, 1, 2)
w.u8(RECLAIM).u8(1)
w.u8(ADVANCE).u8(200).u16(1000)
w.u8(DREP_OP).u8(0).u64(9).u8(5)
w.u8(ADVANCE).u8(200).u16(1500)
w.u8(ADVANCE).u8(200).u16(1500)
w.u8(ADVANCE).u8(200).u16(1500)
w.u8(ADVANCE).u8(200).u16(1500)
mad_route['release_retries'] = bytes(w.b)
w = W()
conn_up(w, 3, 4, remote=0x04000001, peer=ADDR_A)
w.u8(RECLAIM).u8(3)
# The peer's DREP for the daemon's DREQ, as a datagram: DREP local = the DREQ's remote.
built(w, K_DREP, 4, 1, 3, 4, src=ADDR_A)
mad_route['release_drep_datagram'] = bytes(w.b)
mad_route['req_no_listener'] = bytes(built(W(), K_REQ, 5, 1, 0, 0).b)
mad_route['req_listened_then_rej'] = bytes(
    built(built(W(), K_REQ, 5, 1, 0, 0, listened=1 | (2 << 1)), K_REJ, 5, 1, 0, 0, src=ADDR_A).b)
mad_route['req_then_forget'] = bytes(
    built(built(W(), K_REQ, 5, 1, 0, 0, listened=3).u8(FORGET).u8(1), K_REJ, 5, 1, 0, 0).b)
mad_route['sidr_req_no_listener'] = bytes(built(W(), K_SIDR_REQ, 6, 2, 0, 0).b)
mad_route['orphan_dreq'] = bytes(built(W(), K_DREQ, 6, 2, 7, 3, src=ADDR_V6, dst=ADDR_V6).b)
mad_route['rep_rtu_mra'] = bytes(built(built(built(W(), K_REP, 6, 2, 1, 1), K_RTU, 6, 2, 1, 1,
                                             listened=1), K_MRA, 6, 2, 2, 2).b)
mad_route['sidr_rep_lap_apr_cpi'] = bytes(built(built(built(built(W(), K_SIDR_REP, 6, 2, 1, 1),
                                                            K_LAP, 1, 1, 2, 2), K_APR, 1, 1, 2, 2),
                                                K_CPI, 0, 0, 0, 0).b)
mad_route['flipped_icrc'] = bytes(built(W(), K_REQ, 5, 1, 0, 0, flip=0xC3).u16(30).b)
w = W().u8(RAW)
ep(w, ADDR_A); ep(w, ADDR_B)
d = gmp(req(0x05000001))
mad_route['raw_req_bad_icrc'] = bytes(w.u16(len(d)).raw(d).b)
w = W().u8(RAW)
ep(w, ADDR_A); ep(w, ADDR_B)
mad_route['raw_short'] = bytes(w.u16(9).raw(b'\x64' + bytes(8)).b)
w = W().u8(BULK_CONNS).u8(2)
comm(w, 2, 0); w.u32(5).u32(6).u8(ADDR_A).u8(ADDR_B)
w.u16(4200).u8(RECLAIM).u8(2)
for _ in range(6):
    w.u8(ADVANCE).u8(100).u8(200)
mad_route['bulk_conns_reclaim'] = bytes(w.b)
w = W().u8(BULK_REQS).u8(3).u8(ADDR_A).u32(100).u16(4200)
built(w, K_REJ, 0, 0, 0, 0)
mad_route['bulk_requesters'] = bytes(w.b)
write('mad_route', mad_route)

# ---- cm_manager_fuzz: config byte, then opcode(1) operands ---------------------------------
H1 = 0x80  # the op acts on host 1
(CONNECT, ACCEPT, REJECT, ESTABLISH, NOTIFY, DISCONNECT, DESTROY, SIDR_QUERY, SIDR_ANSWER, LISTEN_OP,
 QP_ATTRS, DELIVER_ONE, DELIVER_ALL, RAW_MAD, BUILT_MAD, ADVANCE_OP) = range(16)


def path(w, remote=1, mtu=3, plt=18):
    return w.u8(remote).u8(mtu).u8(plt).u32(0x12345)


def connect(w, h=0, flags=0, sid=0, ip=1, pd=b''):
    w.u8(CONNECT | (H1 if h else 0))
    path(w)
    w.u8(sid).u8(0).u32(0x100).u8(flags).u8(7).u8(7).u8(200).u8(200)
    w.u8(ip)
    if ip:
        w.u16(5000)
        if ip == 3:
            w.u8(5)
    return w.u8(len(pd)).raw(pd)


def listen(w, h=1, sid=0, stop=0):
    return w.u8(LISTEN_OP | (H1 if h else 0)).u8(sid).u8(stop)


def accept(w, h=1, pick=0, pd=b''):
    return w.u8(ACCEPT | (H1 if h else 0)).u8(pick).u8(0).u8(200).u8(200).u8(7).u8(0).u8(len(pd)).raw(pd)


def reject(w, h=1, pick=0):
    return w.u8(REJECT | (H1 if h else 0)).u8(pick).u8(0).u8(28).u8(0).u8(4).raw(b'abcd')


def disconnect(w, h=0, pick=0):
    return w.u8(DISCONNECT | (H1 if h else 0)).u8(pick).u8(0)


def advance(w, ms):
    if ms < 256:
        return w.u8(ADVANCE_OP).u8(0).u8(ms)
    return w.u8(ADVANCE_OP).u8(100).u16(ms)


def all_(w):
    return w.u8(DELIVER_ALL)


cm = {}
w = W().u8(0)
listen(w); connect(w); all_(w); accept(w); all_(w); all_(w); disconnect(w); all_(w); all_(w)
advance(w, 200); advance(w, 5000)
cm['connect_accept_disconnect'] = bytes(w.b)
w = W().u8(0)
listen(w); connect(w, flags=2); all_(w); accept(w); all_(w)
w.u8(ESTABLISH).u8(0); all_(w); disconnect(w, h=1); all_(w); disconnect(w, h=0); all_(w)
advance(w, 1000)
cm['manual_rtu_passive_disconnect'] = bytes(w.b)
w = W().u8(0)
listen(w); connect(w); all_(w); reject(w); all_(w)
cm['reject'] = bytes(w.b)
w = W().u8(1 | (2 << 1) | (2 << 5))  # 2 retries, short timeouts
connect(w)  # nobody listens on host 1: REJ
all_(w)
w.u8(CONNECT); path(w, remote=0); w.u8(0).u8(0).u32(1).u8(0).u8(7).u8(7).u8(3).u8(3).u8(0).u8(0)
for _ in range(5):
    advance(w, 3000)
cm['unreachable_retries'] = bytes(w.b)
w = W().u8(0)
listen(w, sid=2)
w.u8(SIDR_QUERY); path(w); w.u8(2).u8(1).u16(7).u8(0)
all_(w)
w.u8(SIDR_ANSWER | H1).u8(0).u8(0).u32(0x99).u32(0x1111).u8(0)
all_(w)
cm['sidr'] = bytes(w.b)
w = W().u8(0)
listen(w); connect(w); all_(w); w.u8(DESTROY).u8(0); all_(w); accept(w); all_(w); advance(w, 5000)
cm['destroy_connecting'] = bytes(w.b)
w = W().u8(0)
listen(w); connect(w); w.u8(DELIVER_ONE).u8(0).u8(0x84); all_(w); accept(w)
w.u8(DELIVER_ONE).u8(0).u8(0x84); w.u8(DELIVER_ONE).u8(0).u8(4); all_(w)
cm['duplicates'] = bytes(w.b)
w = W().u8(0)
listen(w); connect(w); all_(w); accept(w); all_(w); all_(w)
# A DREQ built for host 0's connection, from what peer() says of it.
# kind DREQ, to ids[0], from peer(ids[0]) (how 0, index 0), no body, the TID, QPN 0x40 (host
# 0's), from host 1.
w.u8(BUILT_MAD).u8(5).u8(0).u8(0).u8(0).u8(0).u64(0x77).u8(0).u8(0)
all_(w)
w.u8(BUILT_MAD).u8(5).u8(0).u8(0).u8(0).u8(0).u64(0x77).u8(0).u8(0)
advance(w, 300)
cm['built_dreq'] = bytes(w.b)
w = W().u8(0)
# The fields each kind reads after its TID: REQ, MRA, REJ, DREQ, SIDR_REQ.
EXTRA = {0: 4, 1: 1, 2: 2, 5: 1, 7: 1}
for k in range(12):
    # kind, receiver (pick 0), sender (how 6: 0), no body, the TID, the kind's fields, the source
    w.u8(BUILT_MAD).u8(k).u8(0).u8(6).u8(0).u64(k).raw(bytes(EXTRA.get(k, 0))).u8(0)
cm['built_every_message'] = bytes(w.b)
w = W().u8(0)
w.u8(RAW_MAD).u8(0).u8(0).raw(mad(REQ, struct.pack('>IIQ', 0x01000001, 0, 0x0106000000000001)))
w.u8(RAW_MAD).u8(1).u8(250).u16(100).raw(bytes(100))
cm['raw'] = bytes(w.b)
w = W().u8(0)
listen(w)
for _ in range(8):
    connect(w)
all_(w)
for i in range(7):
    accept(w, pick=i)
all_(w); all_(w)
cm['connection_bound'] = bytes(w.b)
w = W().u8(0)
listen(w); connect(w); all_(w); accept(w); all_(w); all_(w)
w.u8(QP_ATTRS).u8(0).u8(2).u8(QP_ATTRS).u8(0).u8(3).u8(NOTIFY | H1).u8(0)
w.u8(DELIVER_ONE).u8(0).u8(1).u8(3)  # another attribute
cm['qp_attrs_notify'] = bytes(w.b)
# Manager::sidr_query with rdma_cm's IP header of IP version 5: connect() answers EINVAL, but
# sidr_query hands it to wire::write_cma_hdr, whose assertion fails (src/cm/manager.cc).
# config, SIDR_QUERY on host 0: path (remote 1, MTU 3, lifetime 18, flow 0), service 0,
# ip (how 3: port 0, version 5), no private data.
cm['crash-sidr-query-bad-ip-version'] = bytes([0, SIDR_QUERY, 1, 3, 18, 0, 0, 0, 0, 0, 3, 0, 0, 5, 0])
write('cm_manager', cm)
