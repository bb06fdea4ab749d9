"""The lab provider: machines that already exist (a university cluster), reached over SSH.

Nothing is created or deleted: ``provision`` records the hosts, generates the ssh_config (with ProxyJump or
ProxyCommand where given) and checks every host in parallel; unreachable hosts are named with the SSH error.
Host keys are trusted on first use and verified afterwards.
"""

from __future__ import annotations

import os
import time
from typing import Any

from testbed import remote, ssh
from testbed.capabilities import Capability, Repairs
from testbed.errors import TestbedError
from testbed.hosts import Host
from testbed.providers.base import Made, Pacer, Provider
from testbed.providers.lab.settings import LabSettings
from testbed.textfmt import plural


class LabProvider(Provider, Repairs):
    kind = "lab"
    lacking = {Capability.IMAGES: "a lab's machines keep their disks (nothing to boot an image on); an unchanged "
                                  "set-up is skipped by its content address",
               Capability.EXTEND: "a lab's machines are held by no reservation of testbed's",
               Capability.EXPIRE: "a lab's hosts are not ours to end: expiry is not offered",
               Capability.KILL_HOST: "a lab's machines are shared, not testbed's to power off",
               Capability.CUT_NETWORK: "a lab's machines are shared, not testbed's to take off the network"}
    repair_how = "answered again (a reboot)"
    _why: dict[str, str]  # host -> why it did not answer (set by reach)

    @property
    def settings(self) -> LabSettings:
        assert isinstance(self.spec.provider, LabSettings)
        return self.spec.provider

    def hosts_from_spec(self) -> list[Host]:
        """The spec's hosts; what the spec leaves out (user, port, jump host, key, the real host name of an
        alias, a ProxyCommand) comes from the user's own OpenSSH config (provider.ssh_config) for the host's
        address, as a plain ``ssh ADDRESS`` would use it. With no key in the spec the ssh-agent is offered too."""
        s = self.settings
        out = []
        for i, h in enumerate(s.hosts):
            addr = h.address or h.name
            mine = self._user_config(addr)
            key = h.key or s.key
            user = h.user or (self.spec.user if self.spec.user_given else mine.get("user") or self.spec.user)
            port = h.port if "port" in h.model_fields_set else int(mine.get("port") or h.port)
            jump = h.proxy_jump or s.proxy_jump or mine.get("proxyjump")
            facts: dict[str, Any] = {"provider": "lab"}
            if key is None:  # log in as the user's ssh would: their identity files, their agent, then ours
                facts["ssh"] = {"identities": list(mine.get("identityfile") or []),
                                "identities_only": mine.get("identitiesonly") == "yes",
                                "identity_agent": mine.get("identityagent"),
                                "from": s.ssh_config if mine else None}
            jumps = self._jumps(jump, {x.name for x in s.hosts}) if jump else []
            if jumps:  # the jump hosts the user's config defines (an alias such as 'bastion')
                facts["ssh_jumps"] = jumps
            if not jump and mine.get("proxycommand"):  # the config's ProxyCommand, unless the spec names a jump
                facts["ssh_proxy_command"] = ssh.proxy_command(str(mine["proxycommand"]), addr,
                                                               s.ssh_config or ssh.USER_SSH_CONFIG)
            out.append(Host(name=h.name, address=mine.get("hostname") or addr, port=port, user=user,
                            key=os.path.expanduser(key) if key else None, proxy_jump=jump,
                            groups=sorted({*self.spec.groups_for(h.name, i), *h.groups}), facts=facts))
        return out

    def _user_config(self, host: str) -> dict[str, Any]:
        """The user's OpenSSH config for ``host`` (read once per provider and host)."""
        cache: dict[str, dict[str, Any]] = self.__dict__.setdefault("_ssh_seen", {})
        if host not in cache:
            cache[host] = ssh.user_ssh_config(host, self.settings.ssh_config)
        return cache[host]

    def _jumps(self, jump: str, own: set[str], depth: int = 0) -> list[dict[str, Any]]:
        """Blocks for the hops of a ProxyJump (``[user@]host[:port],...``) that the user's config defines, their
        own jump hosts first; never one of this testbed's hosts (they have their blocks). Bounded depth."""
        out: list[dict[str, Any]] = []
        for hop in jump.split(","):
            alias = hop.rsplit("@", 1)[-1]
            alias = alias[1:].split("]", 1)[0] if alias.startswith("[") else alias.split(":", 1)[0]
            if not alias or alias in own or depth > 4:
                continue
            mine = self._user_config(alias)
            if not mine:
                continue
            inner = mine.get("proxyjump")
            if inner:
                out += self._jumps(str(inner), own, depth + 1)
            cmd = mine.get("proxycommand")
            out.append({"alias": alias, "hostname": mine.get("hostname"), "port": mine.get("port"),
                        "user": mine.get("user"), "identities": list(mine.get("identityfile") or []),
                        "identities_only": mine.get("identitiesonly") == "yes",
                        "identity_agent": mine.get("identityagent"), "proxy_jump": inner,
                        "proxy_command": ssh.proxy_command(str(cmd), alias, self.settings.ssh_config or
                                                           ssh.USER_SSH_CONFIG) if cmd and not inner else None,
                        "source": self.settings.ssh_config})
        return out

    @property
    def connect_timeout(self) -> int:
        return self.settings.connect_timeout

    def preflight(self) -> None:
        cfg = self.settings.ssh_config
        if cfg and cfg != ssh.USER_SSH_CONFIG and not os.path.isfile(os.path.expanduser(cfg)):
            raise TestbedError(f"provider.ssh_config names {cfg}, which is not a file", where=self.spec.source or
                               "inventory", fix="name your OpenSSH config file, or remove provider.ssh_config")
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
        deadline = time.monotonic() + self.ssh_timeout
        pause = Pacer(2.0, deadline, cap=10.0)
        remote.close_connections(self.name, [host.name])
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
        planned = len(self.spec.provider.planned_hosts() or [])
        return TestbedError(f"{len(bad)} of {plural(planned, 'lab host')} {'is' if len(bad) == 1 else 'are'} "
                            "unreachable: " + "; ".join(bad), where=f"testbed {self.name}",
                            fix=f"check the addresses, your user and key (when provider.key is not set, the keys "
                                f"of your ssh config and ssh-agent are tried, then the testbed key {pub}: add "
                                "one of them to ~/.ssh/authorized_keys on each host)")

    def release(self) -> None:
        """Nothing to release: lab machines are never deleted (destroy only forgets them)."""
