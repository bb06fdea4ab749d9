"""The lab provider: machines that already exist (a university cluster), reached over SSH.

Nothing is created or deleted: ``provision`` records the hosts, generates the ssh_config (with ProxyJump
where given) and checks every host in parallel; unreachable hosts are named with the SSH error.
Host keys are trusted on first use and verified afterwards.
"""

from __future__ import annotations

import os
import time

from testbed import remote, ssh
from testbed.errors import TestbedError
from testbed.hosts import Host
from testbed.providers.base import Made, Provider
from testbed.providers.settings import LabSettings


class LabProvider(Provider):
    kind = "lab"
    capabilities = frozenset({"repair"})
    keeps_hosts = True  # destroy only forgets the machines: their files stay
    repair_how = "answered again (a reboot)"
    _why: dict[str, str]  # host -> why it did not answer (set by reach)

    @property
    def settings(self) -> LabSettings:
        assert isinstance(self.spec.provider, LabSettings)
        return self.spec.provider

    def hosts_from_spec(self) -> list[Host]:
        s = self.settings
        out = []
        for i, h in enumerate(s.hosts):
            key = h.key or s.key
            out.append(Host(name=h.name, address=h.address or h.name, port=h.port, user=h.user or self.spec.user,
                            key=os.path.expanduser(key) if key else None, proxy_jump=h.proxy_jump or s.proxy_jump,
                            groups=sorted({*self.spec.groups_for(h.name, i), *h.groups}),
                            facts={"provider": "lab"}))
        return out

    @property
    def connect_timeout(self) -> int:
        return self.settings.connect_timeout

    def preflight(self) -> None:
        for h in self.hosts_from_spec():
            if h.key and not os.path.exists(h.key):
                raise TestbedError(f"the SSH key {h.key} for {h.name} does not exist",
                                   where=self.spec.source or "inventory", fix="set provider.key to your private key")

    def wants_key(self) -> bool:
        return any(h.key is None for h in self.hosts_from_spec())

    def create(self, public_key: str | None) -> Made:
        """Nothing to make: the hosts as the spec lists them."""
        return Made(self.hosts_from_spec())

    def discard(self, host: Host) -> list[str]:
        """testbed cannot remake a lab machine: wait (up to provider.ssh_timeout) for it to answer again, as after
        a reboot; its host key must be the pinned one."""
        from testbed.providers.base import Pacer

        deadline = time.monotonic() + self.ssh_timeout
        pause = Pacer(2.0, deadline, cap=10.0)
        ssh.close_connections(self.name, [host.name])
        while True:
            r = remote.run(self.name, [host.name], "true", timeout=self.connect_timeout + 5, mux="none")[0]
            if r.ok:
                return [host.name]
            if time.monotonic() >= deadline:
                why = r.error or ssh.describe_ssh_failure(r.stderr, host.name, self.name)
                raise TestbedError(f"lab host {host.name} ({host.address}) did not answer within "
                                   f"{int(self.ssh_timeout)} s: {why}", where=f"{host.user}@{host.address}:{host.port}",
                                   fix=self.repair_fix(host))
            self.progress(f"{host.name}: waiting for it to answer SSH")
            pause.sleep()

    def repair_fix(self, h: Host) -> str:
        return (f"testbed cannot remake a lab machine: reboot or power-cycle {h.name} (its console, IPMI, or the "
                f"cluster's admins), then 'testbed provision {self.name} --repair {h.name}'")

    def reach(self, made: Made, everyone: list[Host] | None = None) -> None:
        """One login per host (through its jump host, if any), which also pins its key on first use; the
        kernel and CPU count become facts. A host that does not answer is recorded as unreachable."""
        hosts = made.hosts
        ssh.write_ssh_config(self.name, everyone or hosts, connect_timeout=self.connect_timeout)
        results = remote.run(self.name, [h.name for h in hosts], "uname -srm; nproc", timeout=self.connect_timeout + 20)
        self._why = {}
        for h, r in zip(hosts, results, strict=True):
            if r.ok:
                lines = r.stdout.split("\n")
                h.state = "up"
                h.facts.update({"kernel": lines[0].strip(), "cpus": int(lines[1]) if lines[1].strip().isdigit() else 0})
            else:
                h.state = "unreachable"
                self._why[h.name] = r.error or r.stderr.strip() or f"exit {r.exit_code}"

    def unreachable(self, hosts: list[Host]) -> TestbedError:
        bad = [f"{h.name} ({h.user}@{h.address}:{h.port}): {self._why.get(h.name, '')}" for h in hosts]
        pub = ssh.key_path(self.name).with_suffix(".pub")
        return TestbedError(f"{len(bad)} of {len(self.spec.provider.planned_hosts() or [])} lab hosts are "
                            "unreachable: " + "; ".join(bad), where=f"testbed {self.name}",
                            fix=f"check the addresses, your user and key (the testbed key is {pub} when "
                                "provider.key is not set: add it to ~/.ssh/authorized_keys on each host)")

    def release(self) -> None:
        """Nothing to release: lab machines are never deleted (destroy only forgets them)."""
