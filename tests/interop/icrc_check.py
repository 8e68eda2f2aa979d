#!/usr/bin/python3
"""Recompute the ICRC of every RoCEv2 packet (IPv4, UDP port 4791) in a classic pcap file.

    icrc_check.py FILE.pcap      exit 0 when every packet checks out (and there is at least one)

Written from the spec, on purpose sharing nothing with urdma's own ICRC code (src/wire/icrc.cc):
IBA Annex A17 (RoCEv2), A17.8: the ICRC is the CRC-32 of the Ethernet/zlib polynomial over
  64 bits of ones (the masked LRH a RoCEv2 packet does not carry),
  the IPv4 header with the variant fields masked to ones: Type of Service, Time to Live, Header
  Checksum,
  the UDP header with its Checksum masked to ones,
  the BTH with its reserved 8 bits (byte 4) masked to ones,
  and everything after the BTH up to the ICRC itself;
sent as the last 4 bytes of the UDP payload, least significant byte first.
"""
import struct
import sys
import zlib

ROCEV2_PORT = 4791


def frames(path):
    with open(path, "rb") as f:
        head = f.read(24)
        order = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<",
                 b"\xa1\xb2\xc3\xd4": ">", b"\xa1\xb2\x3c\x4d": ">"}.get(head[:4])
        if order is None:
            sys.exit("%s: not a classic pcap file" % path)
        linktype = struct.unpack(order + "I", head[20:24])[0]
        if linktype != 1:
            sys.exit("%s: link type %d, expected Ethernet" % (path, linktype))
        number = 0
        while True:
            record = f.read(16)
            if len(record) < 16:
                return
            number += 1
            yield number, f.read(struct.unpack(order + "4I", record)[2])


def rocev2_ipv4(frame):
    """The IPv4 packet (without Ethernet padding) if the frame is RoCEv2 over IPv4, else None."""
    if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00" or frame[14] >> 4 != 4:
        return None
    total_length = struct.unpack("!H", frame[16:18])[0]
    ip = frame[14:14 + total_length]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != 17 or struct.unpack("!H", ip[ihl + 2:ihl + 4])[0] != ROCEV2_PORT:
        return None
    return ip


def icrc(ip):
    ihl = (ip[0] & 0x0F) * 4
    masked = bytearray(ip[:-4])
    masked[1] = 0xFF                               # Type of Service (DSCP, ECN)
    masked[8] = 0xFF                               # Time to Live
    masked[10:12] = b"\xff\xff"                    # Header Checksum
    masked[ihl + 6:ihl + 8] = b"\xff\xff"          # UDP Checksum
    masked[ihl + 8 + 4] = 0xFF                     # BTH resv8a
    return zlib.crc32(b"\xff" * 8 + bytes(masked))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    good = bad = 0
    for number, frame in frames(sys.argv[1]):
        ip = rocev2_ipv4(frame)
        if ip is None:
            continue
        carried = struct.unpack("<I", ip[-4:])[0]
        if icrc(ip) == carried:
            good += 1
        else:
            bad += 1
            print("frame %d: %s -> %s opcode 0x%02x: ICRC 0x%08x, computed 0x%08x" % (
                number, ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20])),
                ip[(ip[0] & 0x0F) * 4 + 8], carried, icrc(ip)))
    print("%d RoCEv2 packets: %d ICRC correct, %d wrong" % (good + bad, good, bad))
    return 0 if good > 0 and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
