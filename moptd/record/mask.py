"""`moptd record --mask-hosts`: host names and IPv4 addresses replaced by consistent
pseudonyms across a bundle's files, as sosreport's `sos clean` (`--clean`, `--mask`) does: the
host is ``host0`` everywhere, an address the same ``10.255.x.y`` in the kernel log and in the
command line, so a reader can still follow one host through the bundle
(docs/security.md, "What record redacts"). sos-clean(1)
(https://manpages.ubuntu.com/manpages/noble/man1/sos-clean.1.html): "an IP address of
192.168.1.1 ... obfuscated to, for example, 100.0.0.1, will be changed to 100.0.0.1 in all
occurrences"; as soscleaner did, a host whose name is fully qualified has every name of its
domain masked. Unlike sos, no map is written: nothing in or beside the bundle undoes it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

HOST_KINDS = ("host-name", "ip-address")

# An IPv4 address as inet_ntoa prints it: no leading zeros, so firmware versions such as
# "FWVersion(04.103.00.00)" and "mpt3sas version 40.100.00.00" (in real dmesg,
# tests/fixtures/incidents/clean-boot-nvswitch-550-gpud) are not hosts; and not joined by a
# dash, so kernel releases ("5.15.167.4-microsoft-standard-WSL2") and package versions
# ("MLNX.OFED.LINUX-23.10-2.1.3.1") are not either.
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = re.compile(rf"(?<![\w.-])(?:{_OCTET}\.){{3}}{_OCTET}(?![\w-]|\.\d)")
# A four-part number after the word "version" is one (TensorRT's "version 8.6.1.6").
_VERSION_BEFORE = re.compile(r"version\W{0,3}$", re.IGNORECASE)
# Not masked: they name no host (unspecified, loopback, broadcast and netmasks).
IPV4_KEPT = re.compile(r"0\.0\.0\.0|127\.\d+\.\d+\.\d+|255\.\d+\.\d+\.\d+")
# Host names that name nothing in particular, never masked in text.
GENERIC_NAMES = frozenset({"localhost", "localhost.localdomain", "localdomain", "(none)"})
# A short name ("vm", "gpu") is a common word too: shorter names are masked only where they
# stand as the host (bundle.yaml's host), not in free text.
MIN_NAME_LEN = 4


class HostMasker:
    """Consistent pseudonyms for this host's names, names in its domain and IPv4 addresses,
    shared by every file of one bundle: the host is ``host0``, other names ``host1``...,
    its domain ``domain0``, addresses 10.255.0.1, 10.255.0.2... in the order first seen."""

    def __init__(self, own_names: Iterable[str]) -> None:
        self.hosts: dict[str, str] = {}
        self.domains: dict[str, str] = {}
        self.ips: dict[str, str] = {}
        self._given: set[str] = set()
        own = [n.lower().rstrip(".") for n in own_names if n and n.lower() not in GENERIC_NAMES]
        for n in own:
            self.hosts.setdefault(n, "host0")
            short, _, domain = n.partition(".")
            self.hosts.setdefault(short, "host0")
            # a domain of one label ("lan", "local") is a word too: only "acme.pvt",
            # "ec2.internal" and the like are masked, with every name under them
            if "." in domain:
                self.domains.setdefault(domain, f"domain{len(self.domains)}")
        self._names = self._compile()

    def _compile(self) -> re.Pattern[str] | None:
        alts = []
        for d in sorted(self.domains, key=len, reverse=True):
            alts.append(rf"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+{re.escape(d)}")
            alts.append(re.escape(d))
        alts += [
            re.escape(h)
            for h in sorted(self.hosts, key=len, reverse=True)
            if len(h) >= MIN_NAME_LEN
        ]
        if not alts:
            return None
        return re.compile(rf"(?<![\w.-])(?:{'|'.join(alts)})(?![\w-]|\.[a-z0-9])", re.IGNORECASE)

    def host(self, name: str) -> str:
        """The pseudonym of a host name (bundle.yaml's host)."""
        key = name.lower().rstrip(".")
        if key in GENERIC_NAMES:
            return name
        return self._name(key)

    def _name(self, key: str) -> str:
        if key in self.domains:
            return self.domains[key]
        if key not in self.hosts:  # another host of this host's domain
            self.hosts[key] = f"host{len(set(self.hosts.values()))}"
        return self.hosts[key]

    def ip(self, addr: str) -> str:
        if addr in self._given:  # already a pseudonym: masking twice changes nothing
            return addr
        if addr not in self.ips:
            n = len(self.ips) + 1
            self.ips[addr] = f"10.255.{n >> 8}.{n & 255}"
            self._given.add(self.ips[addr])
        return self.ips[addr]

    def mask(self, text: str, counts: Counter[str], addresses: bool = True) -> str:
        if self._names is not None:

            def name(m: re.Match[str]) -> str:
                counts["host-name"] += 1
                return self._name(m.group(0).lower())

            text = self._names.sub(name, text)
        if addresses:

            def addr(m: re.Match[str]) -> str:
                a = m.group(0)
                before = m.string[max(0, m.start() - 12) : m.start()]
                if IPV4_KEPT.fullmatch(a) or _VERSION_BEFORE.search(before):
                    return a
                masked = self.ip(a)
                counts["ip-address"] += masked != a
                return masked

            text = IPV4.sub(addr, text)
        return text
