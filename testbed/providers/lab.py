"""The lab provider: machines that already exist (a university cluster), reached over SSH.

Nothing is created or deleted: ``provision`` records the hosts, generates the ssh_config (with ProxyJump
where given) and checks every host in parallel; unreachable hosts are named with the SSH error.
Host keys are trusted on first use and verified afterwards.
"""

from __future__ import annotations

import os

from testbed import remote, ssh
from testbed.errors import TestbedError
from testbed.hosts import Host
from testbed.providers.base import Provider
from testbed.spec import LabSettings


class LabProvider(Provider):
    kind = "lab"

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

    def provision(self) -> list[Host]:
        hosts = self.hosts_from_spec()
        for h in hosts:
            if h.key and not os.path.exists(h.key):
                raise TestbedError(f"the SSH key {h.key} for {h.name} does not exist",
                                   where=self.spec.source or "inventory", fix="set provider.key to your private key")
        if any(h.key is None for h in hosts):
            ssh.ensure_keypair(self.name)
        self.record_testbed("provisioning")
        ssh.write_ssh_config(self.name, hosts, connect_timeout=self.settings.connect_timeout)
        results = remote.run(self.name, [h.name for h in hosts], "uname -srm; nproc",
                             timeout=self.settings.connect_timeout + 20)
        bad = []
        for h, r in zip(hosts, results, strict=True):
            if r.ok:
                lines = r.stdout.split("\n")
                h.state = "up"
                h.facts.update({"kernel": lines[0].strip(), "cpus": int(lines[1]) if lines[1].strip().isdigit() else 0})
            else:
                h.state = "unreachable"
                bad.append(f"{h.name} ({h.user}@{h.address}:{h.port}): "
                           f"{r.error or r.stderr.strip() or f'exit {r.exit_code}'}")
        self.store.set_hosts(self.name, hosts)
        ssh.write_inventory(self.name, hosts, self.spec.vars)
        self.record_testbed("degraded" if bad else "up")
        if bad:
            pub = ssh.key_path(self.name).with_suffix(".pub")
            raise TestbedError(f"{len(bad)} of {len(hosts)} lab hosts are unreachable: " + "; ".join(bad),
                               where=f"testbed {self.name}",
                               fix=f"check the addresses, your user and key (the testbed key is {pub} when "
                                   "provider.key is not set: add it to ~/.ssh/authorized_keys on each host)")
        return hosts

    def destroy(self) -> None:
        """Forget the hosts (lab machines are never deleted)."""
        ssh.close_connections(self.name, [h.name for h in self.store.hosts(self.name)], remove=True)
        self.store.delete_testbed(self.name)
