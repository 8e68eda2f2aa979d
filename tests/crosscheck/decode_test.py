#!/usr/bin/python3
"""`urdma decode` against tshark's InfiniBand dissector, on the reference captures of real Linux
rxe traffic and on captures damaged on purpose (with scapy).

usage: decode_test.py URDMA_BINARY DATA_DIR
Prints one line per check and ends with "N passed, M failed"; exits non-zero on any failure.
"""
import os
import re
import subprocess
import sys
import tempfile

from scapy.all import IP, UDP, Raw, rdpcap, wrpcap  # Debian's python3-scapy

URDMA, DATA = sys.argv[1], sys.argv[2]
REFERENCES = ["rxe-to-rxe.pcap", "rxe-guest-to-host.pcap"]
# tshark's Info column for CM MADs → the message name urdma prints after "CM".
CM_NAMES = {
    "ConnectRequest": "REQ", "ConnectReply": "REP", "ReadyToUse": "RTU",
    "DisconnectRequest": "DREQ", "DisconnectReply": "DREP", "ConnectReject": "REJ",
    "MsgRcptAck": "MRA",
}

passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("ok      " if ok else "FAILED  ") + what)
    if ok:
        passed += 1
    else:
        failed += 1


def decode(path, *flags):
    r = subprocess.run([URDMA, "decode", *flags, path], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def packet_lines(stdout):
    """frame number → the line urdma printed for it."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+\S+ > \S+ (.*)", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def tshark_info(path):
    r = subprocess.run(["tshark", "-r", path, "-T", "fields", "-e", "frame.number",
                        "-e", "_ws.col.Info"], capture_output=True, text=True, check=True)
    rows = {}
    for line in r.stdout.splitlines():
        num, info = line.split("\t", 1)
        rows[int(num)] = info.strip()
    return rows


for name in REFERENCES:
    path = os.path.join(DATA, name)
    code, out, _ = decode(path)
    check(code == 0, f"{name}: urdma decode exits 0 (every packet parses, every ICRC ok)")
    ours = packet_lines(out)
    theirs = tshark_info(path)
    check(sorted(ours) == sorted(theirs), f"{name}: one line per frame ({len(theirs)} frames)")
    mismatches = []
    for num, info in theirs.items():
        line = ours.get(num, "")
        if info.startswith("CM: "):
            want = "CM " + CM_NAMES.get(info[4:].split()[0], "?")
            good = want in line
        else:
            # "RC Send Only QP=0x000011" → opcode name and QP as urdma prints them.
            m = re.match(r"(.*?) QP=(0x[0-9a-f]+)", info)
            good = bool(m) and line.startswith(m.group(1) + " ") and f"QP={m.group(2)}" in line
        if not good or "icrc=ok" not in line:
            mismatches.append((num, info, line))
    check(not mismatches, f"{name}: opcode, QP and message type agree with tshark on every frame"
          + (f" — first mismatch {mismatches[0]}" if mismatches else ""))
    code, out_v, _ = decode(path, "-v")
    check(code == 0 and out_v.count("ICRC.icrc: ok") == len(theirs),
          f"{name}: -v prints every packet's fields")

with tempfile.TemporaryDirectory() as tmp:
    frames = rdpcap(os.path.join(DATA, "rxe-to-rxe.pcap"))

    # Frame 12 is an RDMA WRITE ONLY with 64 bytes of payload: flip one payload bit.
    damaged = frames.copy()
    raw = bytearray(bytes(damaged[11][UDP].payload))
    raw[12 + 16 + 5] ^= 0x10
    damaged[11][UDP].remove_payload()
    damaged[11][UDP].add_payload(Raw(bytes(raw)))
    bad_icrc = os.path.join(tmp, "bad-icrc.pcap")
    wrpcap(bad_icrc, damaged)
    code, out, _ = decode(bad_icrc)
    line = packet_lines(out).get(12, "")
    check(code == 1, "a flipped payload bit makes urdma decode exit 1")
    check("icrc=BAD" in line and "1 with a bad ICRC" in out,
          "... and the line of that frame says the ICRC is bad")
    check(sum("icrc=ok" in l for l in packet_lines(out).values()) == 70,
          "... and every other frame still verifies")

    # Frame 5 is an ACK: cut its UDP payload to 10 bytes (shorter than a BTH), lengths fixed up.
    short = frames.copy()
    ip = short[4][IP]
    payload = bytes(ip[UDP].payload)[:10]
    ip[UDP].remove_payload()
    ip[UDP].add_payload(Raw(payload))
    ip.len = None
    ip.chksum = None
    ip[UDP].len = None
    short_path = os.path.join(tmp, "short.pcap")
    wrpcap(short_path, short)
    code, out, _ = decode(short_path)
    line = packet_lines(out).get(5, "")
    check(code == 1 and "MALFORMED" in line and "1 malformed" in out,
          "a datagram shorter than a BTH is reported malformed, with exit 1")

    # Frame 1 is a CM REQ: set the MAD base version to 2.
    bad_mad = frames.copy()
    raw = bytearray(bytes(bad_mad[0][UDP].payload))
    raw[12 + 8] = 2  # after BTH and DETH: MAD BaseVersion
    bad_mad[0][UDP].remove_payload()
    bad_mad[0][UDP].add_payload(Raw(bytes(raw)))
    bad_mad_path = os.path.join(tmp, "bad-mad.pcap")
    wrpcap(bad_mad_path, bad_mad)
    code, out, _ = decode(bad_mad_path)
    line = packet_lines(out).get(1, "")
    check(code == 1 and "MALFORMED MAD" in line, "a MAD with a bad base version is malformed")

code, _, err = decode("/nonexistent/capture.pcap")
check(code == 2 and "urdma decode" in err, "an unreadable file exits 2 with a message")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
