#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/engine_fuzz.cc (chunk format documented there).

usage: gen_engine_seeds.py tests/fuzz/corpus/engine
"""
import os, struct, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

# region-table indexes (engine_fuzz.cc kRegions order, then the window)
A, B, Z, TOP, RO, UNAL, NOREMOTE, NOACCESS, RECV, LOCAL, SRC, MWPARENT, MW = range(13)
STARVE = 0x0F
# mode bits
QP_RC, QP_UC, QP_UD = 1, 2, 3
PSN_EXP, PSN_COMP, PSN_DUP = 0x04, 0x08, 0x0C
KEY, FIT = 0x10, 0x20
STRANGER, RAW = 0x80, 0xC0
# extra
def adv(log2): return 0x40 | log2
V6 = 0x80

OPS = {  # name: (opcode, headers)
 'rc_send_first': (0x00, ''), 'rc_send_middle': (0x01, ''), 'rc_send_last': (0x02, ''),
 'rc_send_last_imm': (0x03, 'I'), 'rc_send_only': (0x04, ''), 'rc_send_only_imm': (0x05, 'I'),
 'rc_write_first': (0x06, 'R'), 'rc_write_middle': (0x07, ''), 'rc_write_last': (0x08, ''),
 'rc_write_last_imm': (0x09, 'I'), 'rc_write_only': (0x0A, 'R'), 'rc_write_only_imm': (0x0B, 'RI'),
 'rc_read_req': (0x0C, 'R'), 'rc_read_resp_first': (0x0D, 'A'), 'rc_read_resp_middle': (0x0E, ''),
 'rc_read_resp_last': (0x0F, 'A'), 'rc_read_resp_only': (0x10, 'A'), 'rc_ack': (0x11, 'A'),
 'rc_atomic_ack': (0x12, 'AK'), 'rc_cmp_swp': (0x13, 'T'), 'rc_fetch_add': (0x14, 'T'),
 'rc_send_last_inv': (0x16, 'V'), 'rc_send_only_inv': (0x17, 'V'), 'rc_flush': (0x1C, 'FR'),
 'rc_atomic_write': (0x1D, 'R'),
 'uc_send_first': (0x20, ''), 'uc_send_middle': (0x21, ''), 'uc_send_last': (0x22, ''),
 'uc_send_only': (0x24, ''), 'uc_send_only_imm': (0x25, 'I'), 'uc_write_first': (0x26, 'R'),
 'uc_write_middle': (0x27, ''), 'uc_write_last': (0x28, ''), 'uc_write_only': (0x2A, 'R'),
 'uc_write_only_imm': (0x2B, 'RI'),
 'ud_send_only': (0x64, 'D'), 'ud_send_only_imm': (0x65, 'DI'), 'cnp': (0x81, 'C'),
}

def pkt(name, psn=0, qpn=0, payload=b'', va=0, rkey=0, dma=0, syndrome=0x1F, msn=0, imm=0x12345678,
        qkey=0x11111111, srcqp=0x77, swap=1, cmp=0, orig=0, ack_req=1, pkey=0xFFFF, se=0, tver=0):
    opc, hdrs = OPS[name]
    pad = (4 - len(payload) % 4) % 4
    b = struct.pack('>BBH', opc, (se << 7) | (pad << 4) | tver, pkey)
    b += struct.pack('>I', qpn & 0xFFFFFF) + struct.pack('>I', (ack_req << 31) | (psn & 0xFFFFFF))
    for h in hdrs:
        if h == 'R': b += struct.pack('>QII', va, rkey, dma)
        elif h == 'A': b += struct.pack('>I', (syndrome << 24) | msn)
        elif h == 'D': b += struct.pack('>II', qkey, srcqp)
        elif h == 'I': b += struct.pack('>I', imm)
        elif h == 'V': b += struct.pack('>I', rkey)
        elif h == 'T': b += struct.pack('>QIQQ', va, rkey, swap, cmp)
        elif h == 'K': b += struct.pack('>Q', orig)
        elif h == 'F': b += struct.pack('>I', 0)
        elif h == 'C': b += bytes(16)
    return b + payload + bytes(pad) + bytes(4)

def chunk(data, mode=0, aux=0, extra=0):
    return bytes([mode, aux, extra]) + struct.pack('>H', len(data)) + data

REQ = PSN_EXP | KEY | FIT
def rc(name, aux=A, extra=0, mode_extra=0, **kw):
    return chunk(pkt(name, **kw), QP_RC | REQ | mode_extra, aux, extra)
def uc(name, aux=A, extra=0, **kw):
    return chunk(pkt(name, **kw), QP_UC | REQ, aux, extra)
def resp(name, psn, aux=A, extra=0, **kw):  # response to host B's own requests, literal PSN
    return chunk(pkt(name, psn=psn, **kw), QP_RC, aux, extra)

P = lambda n, v=0x5A: bytes([(v + i) & 0xFF for i in range(n)])
seeds = {
 # --- RC requests
 'rc_send_only': rc('rc_send_only', payload=P(40)),
 'rc_send_first_middle_last': rc('rc_send_first', payload=P(256)) + rc('rc_send_middle', payload=P(256), ack_req=0)
     + rc('rc_send_last', payload=P(10)),
 'rc_send_only_imm': rc('rc_send_only_imm', payload=P(12), se=1),
 'rc_send_first_last_imm': rc('rc_send_first', payload=P(256)) + rc('rc_send_last_imm', payload=P(3)),
 'rc_send_only_inv_window': rc('rc_send_only_inv', aux=MW, payload=P(8)) + rc('rc_write_only', aux=MW, payload=P(8), dma=8),
 'rc_send_only_inv_mr': rc('rc_send_only_inv', aux=A, payload=P(8)),
 'rc_send_too_long': rc('rc_send_only', payload=P(200)) + rc('rc_send_only', payload=P(200)) + rc('rc_send_only', payload=P(200)),
 'rc_send_rnr': rc('rc_send_only', aux=STARVE, payload=P(4)) * 10 + chunk(b'', 0, 0, adv(24)),
 'rc_write_only': rc('rc_write_only', payload=P(64), dma=64),
 'rc_write_first_middle_last': rc('rc_write_first', payload=P(256), dma=600) + rc('rc_write_middle', payload=P(256))
     + rc('rc_write_last', payload=P(88)),
 'rc_write_first_last_imm': rc('rc_write_first', aux=A | 0x80, payload=P(256), dma=300) + rc('rc_write_last_imm', payload=P(44)),
 'rc_write_only_imm': rc('rc_write_only_imm', aux=B, payload=P(16), dma=16),
 'rc_write_zero_length': rc('rc_write_only', aux=RO, dma=0),
 'rc_write_ro': rc('rc_write_only', aux=RO, payload=P(16), dma=16),
 'rc_write_noremote': rc('rc_write_only', aux=NOREMOTE, payload=P(16), dma=16),
 'rc_write_window': rc('rc_write_only', aux=MW | 0x40, payload=P(32), dma=32),
 'rc_write_top_edge': chunk(pkt('rc_write_only', payload=P(64), dma=64), QP_RC | PSN_EXP | KEY, TOP | 0xF0),
 'rc_write_zero_based': rc('rc_write_only', aux=Z | 0x30, payload=P(32), dma=32),
 'rc_read_a': rc('rc_read_req', aux=A, dma=600),
 'rc_read_ro': rc('rc_read_req', aux=RO | 0x20, dma=100),
 'rc_read_noaccess': rc('rc_read_req', aux=NOACCESS, dma=16),
 'rc_read_zero': rc('rc_read_req', aux=A, dma=0),
 'rc_read_window': rc('rc_read_req', aux=MW, dma=512),
 'rc_cmp_swp_a': rc('rc_cmp_swp', aux=A | 0x10, swap=0xdead, cmp=0),
 'rc_fetch_add_z': rc('rc_fetch_add', aux=Z, swap=5),
 'rc_fetch_add_unaligned': rc('rc_fetch_add', aux=UNAL, swap=5),
 'rc_cmp_swp_ro': rc('rc_cmp_swp', aux=RO, swap=1),
 'rc_fetch_add_window': rc('rc_fetch_add', aux=MW, swap=1),
 'rc_dup_write': rc('rc_write_only', payload=P(8), dma=8) + chunk(pkt('rc_write_only', payload=P(8), dma=8), QP_RC | PSN_DUP | KEY | FIT, A),
 'rc_dup_atomic': rc('rc_fetch_add', aux=B, swap=3) + chunk(pkt('rc_fetch_add', swap=3), QP_RC | PSN_DUP | KEY, B),
 'rc_dup_read': rc('rc_read_req', aux=A, dma=300) + chunk(pkt('rc_read_req', dma=300), QP_RC | 0x0C | KEY | FIT, A),
 'rc_out_of_sequence': chunk(pkt('rc_send_only', psn=0x205, payload=P(4)), QP_RC) + chunk(pkt('rc_send_only', psn=0x206, payload=P(4)), QP_RC)
     + rc('rc_send_only', payload=P(4)),
 'rc_flush': rc('rc_flush', dma=8),
 'rc_atomic_write': rc('rc_atomic_write', payload=P(8), dma=8),
 # --- UC
 'uc_send_only': uc('uc_send_only', payload=P(20)),
 'uc_send_first_middle_last': uc('uc_send_first', payload=P(256)) + uc('uc_send_middle', payload=P(256)) + uc('uc_send_last', payload=P(1)),
 'uc_send_gap': uc('uc_send_first', payload=P(256)) + chunk(pkt('uc_send_last', psn=0x3F0, payload=P(4)), QP_UC) + uc('uc_send_only_imm', payload=P(4)),
 'uc_write_only': uc('uc_write_only', payload=P(48), dma=48),
 'uc_write_first_middle_last': uc('uc_write_first', payload=P(256), dma=520) + uc('uc_write_middle', payload=P(256)) + uc('uc_write_last', payload=P(8)),
 'uc_write_only_imm': uc('uc_write_only_imm', aux=B, payload=P(8), dma=8),
 'uc_write_window_wrong_qp': uc('uc_write_only', aux=MW, payload=P(8), dma=8),
 # --- UD
 'ud_send_only': chunk(pkt('ud_send_only', payload=P(100)), QP_UD | KEY),
 'ud_send_only_imm': chunk(pkt('ud_send_only_imm', payload=P(33)), QP_UD | KEY) * 3,
 'ud_send_mtu': chunk(pkt('ud_send_only', payload=P(1024)), QP_UD | KEY),
 'ud_send_over_mtu': chunk(pkt('ud_send_only', payload=P(1028)), QP_UD | KEY),
 'ud_wrong_qkey': chunk(pkt('ud_send_only', qkey=0x1234, payload=P(4)), QP_UD),
 'ud_v6': chunk(pkt('ud_send_only', payload=P(64)), QP_UD | KEY, 0, V6),
 'ud_from_stranger': chunk(pkt('ud_send_only', payload=P(64)), QP_UD | KEY | STRANGER),
 'ud_starved': chunk(pkt('ud_send_only', payload=P(8)), QP_UD | KEY, STARVE) * 10,
 # --- responses to host B's own requests (SEND 0x100-1, WRITE 0x102, READ 0x103-5,
 #     CMP_SWP 0x106, FETCH_ADD 0x107, SEND 0x108)
 'resp_ack_write': resp('rc_ack', 0x102),
 'resp_read_responses': resp('rc_read_resp_first', 0x103, payload=P(256)) + resp('rc_read_resp_middle', 0x104, payload=P(256))
     + resp('rc_read_resp_last', 0x105, payload=P(88)),
 'resp_atomic_acks': resp('rc_atomic_ack', 0x106, orig=7) + resp('rc_atomic_ack', 0x107, orig=9),
 'resp_all': resp('rc_ack', 0x102) + resp('rc_read_resp_first', 0x103, payload=P(256)) + resp('rc_read_resp_middle', 0x104, payload=P(256))
     + resp('rc_read_resp_last', 0x105, payload=P(88)) + resp('rc_atomic_ack', 0x106) + resp('rc_atomic_ack', 0x107) + resp('rc_ack', 0x108),
 'resp_read_only_wrong_length': resp('rc_ack', 0x102) + resp('rc_read_resp_only', 0x103, payload=P(600 % 256)),
 'resp_read_gap': resp('rc_read_resp_last', 0x105, payload=P(88)) + resp('rc_read_resp_first', 0x103, payload=P(256)),
 'resp_nak_seq': resp('rc_ack', 0x100, syndrome=0x60) + resp('rc_ack', 0x102, syndrome=0x60),
 'resp_rnr_nak': resp('rc_ack', 0x100, syndrome=0x21, extra=adv(30)) + resp('rc_ack', 0x100, syndrome=0x21, extra=adv(30)),
 'resp_nak_access': resp('rc_ack', 0x102, syndrome=0x62),
 'resp_nak_invalid': resp('rc_ack', 0x103, syndrome=0x61),
 'resp_nak_remote_op': resp('rc_ack', 0x106, syndrome=0x63),
 'resp_ack_out_of_range': resp('rc_ack', 0x200) + resp('rc_atomic_ack', 0x0FF),
 'resp_timeouts': chunk(b'', 0, 0, adv(23)) * 6,
 'resp_ack_comp_psn': chunk(pkt('rc_ack'), QP_RC | PSN_COMP) * 3,
 # --- pipeline drops
 'cnp': chunk(pkt('cnp'), QP_RC),
 'short': chunk(bytes(8), RAW),
 'bad_tver': chunk(pkt('rc_send_only', payload=P(4), tver=1), QP_RC | PSN_EXP),
 'bad_icrc': chunk(pkt('rc_send_only', payload=P(4), psn=0x200, qpn=0x11), RAW),
 'bad_pkey': chunk(pkt('rc_send_only', payload=P(4), pkey=0x8001), QP_RC | PSN_EXP),
 'unknown_qpn': chunk(pkt('rc_send_only', payload=P(4), qpn=0x999), PSN_EXP),
 'oversized': chunk(bytes(5000), 0),
 'rc_from_stranger': chunk(pkt('rc_send_only', payload=P(4)), QP_RC | PSN_EXP | STRANGER),
 'uc_opcode_to_rc': chunk(pkt('uc_send_only', payload=P(4)), QP_RC | PSN_EXP),
 'rc_v6': chunk(pkt('rc_send_only', payload=P(4)), QP_RC | PSN_EXP, 0, V6),
 'mixed_family': chunk(pkt('ud_send_only', payload=P(4)), QP_UD | KEY | STRANGER, 0, V6),
}
for i, (name, data) in enumerate(sorted(seeds.items())):
    with open(os.path.join(out, f'{i:02d}_{name}'), 'wb') as f:
        f.write(data)
print(len(seeds), 'seeds')
