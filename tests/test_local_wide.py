"""More than a /24 of local hosts: the subnet's size, the refusal of one too small, the free-block search, and real
hosts on several bridges and both sides of a /24 line reaching each other over SSH, with nothing left after destroy."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localbed import free_subnet, local_bed
from pydantic import ValidationError

from testbed.providers.local.settings import LocalSettings, prefix_for, room


def test_room_and_prefix() -> None:
    assert [room(ipaddress.IPv4Network(f"10.0.0.0/{p}")) for p in (28, 24, 23, 22, 21)] == [12, 252, 508, 1020, 2044]
    assert [prefix_for(n) for n in (1, 12, 13, 252, 253, 508, 509, 1020, 1024)] == [28, 28, 27, 24, 23, 23, 22, 22, 21]


def test_wide_subnet_addresses_cross_the_24_line() -> None:
    s = LocalSettings(hosts=300, subnet="10.220.0.0/23")
    addr = s.planned_addresses()
    assert addr["node0"] == "10.220.0.2" and addr["node253"] == "10.220.0.255" and addr["node254"] == "10.220.1.0"
    assert addr["node299"] == "10.220.1.45" and s.bridges() == 1
    big = LocalSettings(hosts=1024, subnet="10.220.0.0/21")
    assert big.bridges() == 2 and big.planned_addresses()["node1023"] == "10.220.4.1"
    assert LocalSettings(hosts=12, subnet="10.220.0.0/28", bridge_ports=5).bridges() == 3


@pytest.mark.parametrize(("hosts", "subnet", "said"), [
    (260, "10.213.9.0/24", "260 hosts do not fit in 10.213.9.0/24 (provider.subnet: room for 252): give a /23 or "
                           "larger, such as 10.213.8.0/23, or fewer hosts"),
    (1024, "10.220.0.0/22", "1024 hosts do not fit in 10.220.0.0/22 (provider.subnet: room for 1020): give a /21 or "
                            "larger, such as 10.220.0.0/21"),
    (1025, "10.220.0.0/21", "less than or equal to 1024"),
])
def test_too_small_refused(hosts: int, subnet: str, said: str) -> None:
    with pytest.raises(ValidationError) as e:
        LocalSettings(hosts=hosts, subnet=subnet)
    assert said in str(e.value) and len(e.value.errors()) == 1


def test_too_small_one_message_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "big.yml").write_text("provider: {kind: local, hosts: 300, subnet: 10.213.9.0/24}\n")
    r = subprocess.run([sys.executable, "-m", "testbed", "status", "big"], cwd=tmp_path, capture_output=True,
                       text=True, env={**os.environ, "TESTBED_HOME": str(tmp_path / "h"), "COLUMNS": "400"}, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode in (1, 2) and "Traceback" not in out, out
    assert "300 hosts do not fit in 10.213.9.0/24" in out and "10.213.8.0/23" in out, out
    assert not (tmp_path / "h" / "testbeds" / "big").exists()


FREE_BLOCK = """
import subprocess
from testbed.providers.local.provider import free_subnet
def ip(*a): subprocess.run(["ip", *a], check=True)
ip("link", "add", "d0", "type", "veth", "peer", "name", "d0p")
ip("addr", "add", "10.252.1.1/24", "dev", "d0"); ip("link", "set", "d0", "up"); ip("link", "set", "d0p", "up")
print(free_subnet("10.252.0.0/24"))
print(free_subnet("10.252.0.0/24", hosts=300))
print(free_subnet("10.252.0.0/24", hosts=1000))
print(free_subnet("10.252.0.0/24", hosts=300, prefer="10.252.8.0/24"))
print(free_subnet("10.252.0.0/24", hosts=300, prefer="10.252.8.0/23"))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a network namespace with a route to skip)")
def test_free_subnet_finds_a_block_of_the_size_needed() -> None:
    """In a network namespace of its own, 10.252.1.0/24 routed: a /24 is free at 10.252.0.0, but 300 hosts need a
    /23 (10.252.0.0/23 holds the route: the next) and 1,000 a /22; a kept subnet too small for them is not kept."""
    r = subprocess.run(["unshare", "--net", sys.executable, "-c", FREE_BLOCK], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["10.252.0.0/24", "10.252.2.0/23", "10.252.4.0/22", "10.252.2.0/23",
                                "10.252.8.0/23"], r.stdout


def _left(tag: str) -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [ln for ln in ns + links + procs if f"tb{tag}" in ln]


def _reach(bed: object, src: str, dst: str) -> str:
    """``dst``'s hostname as ``src`` reads it over a real SSH login from ``src`` (the testbed's own config)."""
    r = bed.ssh(src, f"ssh -F {bed.ssh_config} -o ControlMaster=no -o ControlPath=none -o BatchMode=yes {dst} "  # type: ignore[attr-defined]
                "hostname", timeout=60)
    assert r.returncode == 0, (src, dst, r.stderr)
    return r.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize(("hosts", "prefix", "ports"), [(12, 24, 5), (256, 23, 128)], ids=["3-bridges", "wide"])
def test_hosts_on_several_bridges_and_both_sides_of_a_24(tmp_path: Path, need_local: None, hosts: int,
                                                          prefix: int, ports: int) -> None:
    """12 hosts, 5 a bridge: 3 bridges; 256 on a /23, 128 a bridge: node254 and node255 past the /24 line, on a
    second bridge. Each far host logs in to the first and back; destroy leaves nothing."""
    t0 = time.monotonic()
    with local_bed(tmp_path / "bed", name="wide", hosts_n=hosts, prefix=prefix, bridge_ports=ports) as bed:
        up_s = time.monotonic() - t0
        prov = bed.provider
        assert prov is not None
        tag = prov.tag
        bridges = sorted({sl.bridge for sl in prov.slots()})
        assert len(bridges) == -(-hosts // ports) and prov.info()["bridges"] == prov.bridges
        first, last = bed.hosts[0], bed.hosts[-1]
        far = [first.name, bed.hosts[ports].name, last.name]
        if prefix < 24:
            assert ipaddress.IPv4Address(last.address) in list(ipaddress.IPv4Network(prov.network).subnets(1))[1]
            far.append(bed.hosts[253].name)  # the last address of the first /24 (x.x.0.255)
        for a in far:
            for b in far:
                if a != b:
                    assert _reach(bed, a, b) == b
        prov.kill_host(last.name)  # repair of one host on the last bridge: back on it, on its own disk
        prov.provision()
        assert _reach(bed, first.name, last.name) == last.name
        st = subprocess.run([sys.executable, "-m", "testbed", "status", "wide", "--json"], cwd=bed.cwd, text=True,
                            capture_output=True, env={**os.environ, "TESTBED_HOME": str(bed.home)}, timeout=120)
        assert st.returncode == 0 and "Traceback" not in st.stderr, st.stderr
        assert st.stdout.count('"up"') >= hosts, st.stdout[-2000:]
        prov.destroy()
        bed.provider = None
    assert _left(tag) == [], _left(tag)
    assert not (bed.home / "testbeds" / "wide").exists()
    print(f"{hosts} hosts on {len(bridges)} bridges up in {up_s:.1f} s (load {Path('/proc/loadavg').read_text()})")


def test_more_hosts_than_the_arp_table_refused_before_anything(tmp_path: Path, need_local: None) -> None:
    """1,000 hosts where this machine keeps 1,024 ARP entries (the default): one message naming the sysctl to
    raise, and no namespace, link or host folder made."""
    most = int(Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3").read_text())
    if most >= 1000 + 64:
        pytest.skip(f"this machine keeps {most} ARP entries: 1,000 hosts would really be made")
    (tmp_path / "inventories").mkdir()
    spec = f"provider: {{kind: local, hosts: 1000, subnet: {free_subnet(22)}}}\nuser: root\n"
    (tmp_path / "inventories" / "arp.yml").write_text(spec)
    home = tmp_path / "h"
    r = subprocess.run([sys.executable, "-m", "testbed", "provision", "arp"], cwd=tmp_path, capture_output=True,
                       text=True, env={**os.environ, "TESTBED_HOME": str(home), "COLUMNS": "400"}, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    assert "1000 local hosts need more ARP entries" in out and "net.ipv4.neigh.default.gc_thresh3=" in out, out
    assert not list(home.glob("testbeds/arp/local/hosts/*"))
    import hashlib

    assert _left(hashlib.sha256(str(home / "testbeds" / "arp").encode()).hexdigest()[:6]) == []  # the provider's tag
