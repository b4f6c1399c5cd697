"""A real OpenLDAP server (Debian's ``slapd`` package) for tests: its own config, data and loopback port.

``Slapd(home, tree)`` writes a ``slapd.conf`` under ``home`` (an mdb database for ``dc=example,dc=org``),
loads ``tree`` (LDIF) with ``slapadd`` and starts ``slapd -d stats`` on a free port, its log (every
connection, bind and search) in ``home/slapd.log``; :meth:`modify` changes the tree with ``ldapmodify``
as the directory's manager; :meth:`stop` ends it and :meth:`start` starts it again on the same port.
:func:`binary` is ``None`` where the package is not installed, so a test can skip saying how to install it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

from bench.ports import free_port
from tests.support.opod_process import wait_until

INSTALL = "apt-get install -y slapd ldap-utils (Debian's packages; .ci/run installs them)"
SUFFIX = "dc=example,dc=org"
MANAGER = f"cn=manager,{SUFFIX}"
MANAGER_PASSWORD = "manager-pw-5d1c"
SERVICE = f"cn=opod,ou=services,{SUFFIX}"
SERVICE_PASSWORD = "service-pw-93ab"
SCHEMAS = ("core", "cosine", "inetorgperson", "nis")


def binary() -> str | None:
    """slapd, where Debian installs it (``/usr/sbin`` is not on every user's PATH); None when absent."""
    found = shutil.which("slapd") or ("/usr/sbin/slapd" if Path("/usr/sbin/slapd").is_file() else None)
    tools = shutil.which("ldapmodify")
    return found if found and tools and Path(found).with_name("slapadd").exists() else None


def person(login: str, name: str, *, mail: str | None = None, password: str = "", ou: str = "people") -> str:
    """The LDIF of one inetOrgPerson under ``ou=OU``; ``mail`` LOGIN@example.org unless given ("" for none)."""
    mail = f"{login}@example.org" if mail is None else mail
    lines = [
        f"dn: uid={login},ou={ou},{SUFFIX}",
        "objectClass: inetOrgPerson",
        f"uid: {login}",
        f"cn: {name}",
        f"sn: {name.split()[-1]}",
    ]
    lines += [f"mail: {mail}"] if mail else []
    lines += [f"userPassword: {password}"] if password else []
    return "\n".join(lines) + "\n"


def group(name: str, members: list[str], *, ou: str = "groups") -> str:
    """The LDIF of a groupOfNames listing ``members`` (logins under ou=people) by DN."""
    lines = [f"dn: cn={name},ou={ou},{SUFFIX}", "objectClass: groupOfNames", f"cn: {name}"]
    lines += [f"member: uid={m},ou=people,{SUFFIX}" for m in members] or [f"member: {SERVICE}"]
    return "\n".join(lines) + "\n"


def member_change(group_name: str, action: str, login: str) -> str:
    """The LDIF that adds a person to a group, or deletes them from it (``action`` add or delete)."""
    return (
        f"dn: cn={group_name},ou=groups,{SUFFIX}\nchangetype: modify\n{action}: member\n"
        f"member: uid={login},ou=people,{SUFFIX}\n"
    )


def base_tree() -> str:
    """The suffix, its people, groups and services units, and the service account opod searches with."""
    return "\n".join(
        [
            f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example\n",
            *(
                f"dn: ou={ou},{SUFFIX}\nobjectClass: organizationalUnit\nou: {ou}\n"
                for ou in ("people", "groups", "services")
            ),
            f"dn: {SERVICE}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: opod\n"
            f"userPassword: {SERVICE_PASSWORD}\n",
        ]
    )


class Slapd:
    def __init__(self, home: Path, tree: str) -> None:
        path = binary()
        if path is None:
            raise FileNotFoundError(f"no slapd binary: {INSTALL}")
        self.binary = path
        self.home = home
        (home / "data").mkdir(parents=True, exist_ok=True)
        self.config = home / "slapd.conf"
        self.config.write_text(self._config())
        (home / "tree.ldif").write_text(base_tree() + "\n" + tree)
        slapadd = Path(path).with_name("slapadd")
        done = subprocess.run(
            [str(slapadd), "-f", str(self.config), "-l", str(home / "tree.ldif")], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"slapadd refused the test's tree ({done.returncode}): {done.stderr}")
        self.port = free_port()
        self.url = f"ldap://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def _config(self) -> str:
        includes = "\n".join(f"include /etc/ldap/schema/{name}.schema" for name in SCHEMAS)
        return f"""{includes}
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {self.home / "slapd.pid"}
sizelimit unlimited
database mdb
maxsize 16777216
suffix "{SUFFIX}"
rootdn "{MANAGER}"
rootpw {MANAGER_PASSWORD}
directory {self.home / "data"}
access to attrs=userPassword by self read by anonymous auth by * none
access to * by dn.exact="{SERVICE}" read by self read by * none
"""

    def start(self) -> None:
        self._log = (self.home / "slapd.log").open("ab")
        # -d: in the foreground, logging connections and operations (stats) to stderr, which the log file keeps.
        self.process = subprocess.Popen(
            [self.binary, "-d", "stats", "-f", str(self.config), "-h", self.url + "/"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.home,
        )
        try:
            wait_until(self._answering, 30, f"slapd to listen on {self.url}; its log:\n{self.log()[-3000:]}")
        except BaseException:
            self.stop()
            raise

    def _answering(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"slapd exited with {self.process.returncode}:\n{self.log()[-3000:]}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return (self.home / "slapd.log").read_text(errors="replace")

    def binds(self, dn: str | None = None) -> int:
        """How many binds slapd took (as ``dn`` when given) since it was first started: its log's BIND lines."""
        found = re.findall(r' BIND dn="([^"]*)" method=', self.log())
        return len(found) if dn is None else sum(1 for d in found if d.lower() == dn.lower())

    def modify(self, ldif: str) -> None:
        """Change the tree as its manager (``ldapmodify -a``: entries without a changetype are added)."""
        done = subprocess.run(
            ["ldapmodify", "-a", "-x", "-H", self.url, "-D", MANAGER, "-w", MANAGER_PASSWORD],
            input=ldif,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"ldapmodify failed ({done.returncode}): {done.stderr}\n{ldif}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self._log.close()
