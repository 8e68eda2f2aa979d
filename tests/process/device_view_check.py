#!/usr/bin/python3
"""The oracle of device_view_test.cc: reads the device view as any sysfs reader does and compares
it with what the verbs report through `ibv_devinfo -v` (ibverbs-utils, on our libibverbs), with
ibv_device's dev_name/dev_path/ibdev_path (read through ctypes) and with `ip -o addr`. Shares no
code with the view. Prints one `mismatch: ...` line per disagreement and exits 1 if there is any;
prints `ok <n> checks` otherwise.

Usage: device_view_check.py [--expect-gid IPV4]   (IPV4 must be in the table)
"""
import ctypes
import ipaddress
import json
import os
import re
import stat
import subprocess
import sys

SYS = "/sys/class/infiniband/urdma0"
PORT = SYS + "/ports/1"
checks = 0
bad = []


def check(what, got, want):
    global checks
    checks += 1
    if got != want:
        bad.append("mismatch: %s: view %r, verbs %r" % (what, got, want))


def read(path):
    with open(path) as f:
        return f.read().rstrip("\n")


devinfo = subprocess.run(["ibv_devinfo", "-v", "-d", "urdma0"], capture_output=True,
                         text=True).stdout


def field(name):
    m = re.search(r"^\s*" + re.escape(name) + r":\s*(.*)$", devinfo, re.M)
    return m.group(1).strip() if m else None


check("node_guid", read(SYS + "/node_guid"), field("node_guid"))
check("sys_image_guid", read(SYS + "/sys_image_guid"), field("sys_image_guid"))
check("fw_ver", read(SYS + "/fw_ver"), field("fw_ver"))
check("node_type", read(SYS + "/node_type"), "1: CA")  # ibv_devinfo: transport InfiniBand
check("numa_node", read(SYS + "/device/numa_node"), "-1")

m = re.match(r"(\w+) \((\d+)\)", field("state") or "")
check("port state", read(PORT + "/state"), "%s: %s" % (m.group(2), m.group(1)[5:]) if m else None)
m = re.match(r"(\w+) \((\d+)\)", field("phys_state") or "")
check("phys_state", read(PORT + "/phys_state").split(":")[0], m.group(2) if m else None)
check("link_layer", read(PORT + "/link_layer"), field("link_layer"))
check("lid", int(read(PORT + "/lid"), 16), int(field("port_lid") or -1))
check("sm_lid", int(read(PORT + "/sm_lid"), 16), int(field("sm_lid") or -1))
width = re.match(r"(\d+)X", field("active_width") or "")
speed = re.match(r"([\d.]+) Gbps", field("active_speed") or "")
rate = re.match(r"([\d.]+) Gb/sec \((\d+)X", read(PORT + "/rate"))
check("rate width", rate.group(2) if rate else None, width.group(1) if width else None)
check("rate", float(rate.group(1)) if rate else None,
      float(speed.group(1)) * int(width.group(1)) if speed and width else None)
check("pkey 0", int(read(PORT + "/pkeys/0"), 16), 0xffff)

# The GID table: a file for each index up to the highest valid one (urdmad writes none above
# it: the readers ask the verbs for GIDs and read types/ndevs of the indexes they consider);
# the verbs' entries match, the rest are zero.
gid_tbl_len = int(field("gid_tbl_len") or 0)
verbs_gids = {}
for m in re.finditer(r"GID\[\s*(\d+)\]:\s*([0-9a-fA-F:.]+), (RoCE v2|RoCE v1|IB)", devinfo):
    verbs_gids[int(m.group(1))] = (ipaddress.IPv6Address(m.group(2)), m.group(3))
addr_dev = {}
for line in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout.splitlines():
    parts = line.split()
    addr = ipaddress.ip_address(parts[3].split("/")[0])
    if addr.version == 4:
        addr = ipaddress.IPv6Address("::ffff:" + str(addr))
    addr_dev[addr] = parts[1]
check("some gids", len(verbs_gids) > 0, True)
gid_files = max(verbs_gids) + 1 if verbs_gids else 0
check("gid files", sorted(int(n) for n in os.listdir(PORT + "/gids")), list(range(gid_files)))
check("gid files within the table", gid_files <= gid_tbl_len, True)
check("type files", sorted(int(n) for n in os.listdir(PORT + "/gid_attrs/types")),
      sorted(verbs_gids))
for i in range(gid_files):
    text = read("%s/gids/%d" % (PORT, i))
    check("gid %d format" % i, bool(re.fullmatch(r"([0-9a-f]{4}:){7}[0-9a-f]{4}", text)), True)
    gid = ipaddress.IPv6Address(text)
    types = "%s/gid_attrs/types/%d" % (PORT, i)
    ndevs = "%s/gid_attrs/ndevs/%d" % (PORT, i)
    if i in verbs_gids:
        check("gid %d" % i, gid, verbs_gids[i][0])
        check("gid %d type" % i, read(types), verbs_gids[i][1])
        check("gid %d ndev" % i, read(ndevs), addr_dev.get(gid))
    else:
        check("gid %d (empty)" % i, int(gid), 0)
        check("gid %d type (empty)" % i, os.path.exists(types), False)
# device/net: the interfaces other than loopback that hold a GID, as `ip` names them; no net/
# at all when there are none (rdma-core's tests take an existing net/ to name a netdev).
# (/sys/class/net is the mounting namespace's, so `ip` says which interface is loopback.)
loopback = {link["ifname"] for link in json.loads(subprocess.run(
    ["ip", "-j", "link"], capture_output=True, text=True).stdout) if "LOOPBACK" in link["flags"]}
netdevs = sorted({addr_dev[g] for g, _ in verbs_gids.values()
                  if g in addr_dev and addr_dev[g] not in loopback})
net_dir = SYS + "/device/net"
check("device/net", sorted(os.listdir(net_dir)) if os.path.isdir(net_dir) else None,
      netdevs or None)
if len(sys.argv) > 2 and sys.argv[1] == "--expect-gid":
    want = ipaddress.IPv6Address("::ffff:" + sys.argv[2])
    check("expected gid in verbs", want in [g for g, _ in verbs_gids.values()], True)
    check("expected gid in view", want in [ipaddress.IPv6Address(read("%s/gids/%d" % (PORT, i)))
                                           for i in range(gid_files)], True)


# ibv_device as the library fills it (rdma-core's struct layout: two op pointers, node and
# transport type, then name[64], dev_name[64], dev_path[256], ibdev_path[256]).
class IbvDevice(ctypes.Structure):
    _fields_ = [("ops", ctypes.c_void_p * 2), ("node_type", ctypes.c_int),
                ("transport_type", ctypes.c_int), ("name", ctypes.c_char * 64),
                ("dev_name", ctypes.c_char * 64), ("dev_path", ctypes.c_char * 256),
                ("ibdev_path", ctypes.c_char * 256)]


lib = ctypes.CDLL("libibverbs.so.1")
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.POINTER(IbvDevice))
n = ctypes.c_int(0)
devs = lib.ibv_get_device_list(ctypes.byref(n))
dev = [devs[i].contents for i in range(n.value) if devs[i].contents.name == b"urdma0"][0]
dev_name = dev.dev_name.decode()
check("ibdev_path", dev.ibdev_path.decode(), SYS)
check("dev_path", dev.dev_path.decode(), "/sys/class/infiniband_verbs/" + dev_name)
check("uverbs ibdev", read("/sys/class/infiniband_verbs/%s/ibdev" % dev_name), "urdma0")
node = "/dev/infiniband/" + dev_name
st = os.stat(node)
check("char device", stat.S_ISCHR(st.st_mode), True)
check("char device rw", os.access(node, os.R_OK | os.W_OK), True)
check("uverbs dev", read("/sys/class/infiniband_verbs/%s/dev" % dev_name),
      "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev)))
# The rest of /sys and /dev is still there.
check("/sys/class/net/lo", os.path.realpath("/sys/class/net/lo").startswith("/sys/devices/"), True)
check("/dev/pts", os.path.isdir("/dev/pts"), True)
check("/dev/null", stat.S_ISCHR(os.stat("/dev/null").st_mode), True)

for line in bad:
    print(line)
print("ok %d checks" % checks if not bad else "%d of %d checks failed" % (len(bad), checks))
sys.exit(1 if bad else 0)
