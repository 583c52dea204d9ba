"""Start a Keycloak on loopback, from Maven, for the ``keycloak`` test tier (docs/adr/0082).

The distribution is ``org.keycloak:keycloak-quarkus-dist:KEYCLOAK_VERSION`` (a zip), fetched
once by Maven (``mvn dependency:copy``) into a cache directory, unpacked and built there
once for what the tests need (``kc.sh build``: an in-memory database, the token-exchange
and fine-grained admin permission features), so that each start is ``kc.sh start
--optimized`` (seconds, not the minute of a build). Keycloak 26.0 runs on Java 17; later
26.x need Java 21, which this machine's Debian does not package.

Every start gets a free loopback port and an empty in-memory database; realms are
imported through the admin REST API (``import_realm``), and ``permit_exchange`` grants a
client the token exchange from an identity provider to an audience (the fine-grained
permissions Keycloak's V1 token exchange asks for, which a realm import cannot carry).

``python -m tools.keycloak fetch`` fills the cache (CI runs it); ``run`` starts one in the
foreground, prints its URL, and stops it (the JVM and its process group) on SIGTERM or
SIGINT.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tools.apache_kafka import find_java
from tools.cache import tool_cache
from tools.ports import free_port

KEYCLOAK_VERSION = "26.0.8"
ARTIFACT = f"org.keycloak:keycloak-quarkus-dist:{KEYCLOAK_VERSION}:zip"
CACHE_ENV = "CALLGATE_KEYCLOAK_CACHE"
FEATURES = "token-exchange,admin-fine-grained-authz"
ADMIN = ("admin", "admin-password-for-tests")
HEAP = "-Xms64m -Xmx512m"
START_TIMEOUT_S = 180.0


class KeycloakUnavailable(RuntimeError):
    """Java or Maven is missing, the distribution could not be fetched or built, or the
    server did not start."""


def cache_dir() -> Path:
    """``$CALLGATE_KEYCLOAK_CACHE``, else ``~/.cache/callgate/keycloak``."""
    return tool_cache("keycloak", CACHE_ENV)


def distribution(version: str = KEYCLOAK_VERSION, cache: Path | None = None) -> Path:
    """The unpacked and built distribution, fetched and built the first time."""
    root = (cache or cache_dir()) / version
    home = root / f"keycloak-{version}"
    done = root / ".built"
    if done.exists() and (home / "bin" / "kc.sh").exists():
        return home
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        zip_path = _fetch(version, Path(tmp))
        shutil.rmtree(home, ignore_errors=True)
        with zipfile.ZipFile(zip_path) as archive:
            archive.extractall(root)
    for script in (home / "bin").glob("*.sh"):
        script.chmod(0o755)
    _build(home)
    done.touch()
    return home


def _fetch(version: str, into: Path) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KeycloakUnavailable("no Maven (mvn on PATH) to fetch the Keycloak distribution")
    artifact = f"org.keycloak:keycloak-quarkus-dist:{version}:zip"
    argv = [mvn, "-q", "-B", "dependency:copy", f"-Dartifact={artifact}",
            f"-DoutputDirectory={into}"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KeycloakUnavailable("mvn did not fetch Keycloak within 900 s") from exc
    found = list(into.glob("keycloak-quarkus-dist-*.zip"))
    if done.returncode != 0 or not found:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise KeycloakUnavailable(f"mvn exited {done.returncode}: {' | '.join(tail)}")
    return found[0]


def _environment(java: str) -> dict[str, str]:
    env = {**os.environ, "JAVA": java, "JAVA_OPTS_KC_HEAP": HEAP}
    env["KC_BOOTSTRAP_ADMIN_USERNAME"], env["KC_BOOTSTRAP_ADMIN_PASSWORD"] = ADMIN
    return env


def _build(home: Path) -> None:
    argv = [str(home / "bin" / "kc.sh"), "build", "--db=dev-mem", f"--features={FEATURES}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          env=_environment(find_java()))  # fmt: skip
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise KeycloakUnavailable(f"kc.sh build exited {done.returncode}: {' | '.join(tail)}")


class Keycloak:
    """One Keycloak on ``127.0.0.1:<free port>``; a context manager that stops it."""

    def __init__(self, log: Path, home: Path | None = None) -> None:
        self.home = home or distribution()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Keycloak:
        argv = [str(self.home / "bin" / "kc.sh"), "start", "--optimized",
                "--http-enabled=true", "--http-host=127.0.0.1", f"--http-port={self.port}",
                "--hostname-strict=false", "--cache=local"]  # fmt: skip
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env=_environment(find_java()),
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(self.url + "/realms/master", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-5:]
                raise KeycloakUnavailable(f"Keycloak exited {self.proc.returncode}: {tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise KeycloakUnavailable(f"Keycloak did not answer within {START_TIMEOUT_S} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the JVM (its whole process group) and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> Keycloak:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the admin REST API ---------------------------------------------------------------

    def issuer(self, realm: str) -> str:
        return f"{self.url}/realms/{realm}"

    def token_endpoint(self, realm: str) -> str:
        return f"{self.issuer(realm)}/protocol/openid-connect/token"

    def admin(self) -> httpx.Client:
        """A client of the admin API, signed in as the bootstrap administrator."""
        answer = httpx.post(
            self.token_endpoint("master"),
            data={"grant_type": "password", "client_id": "admin-cli",
                  "username": ADMIN[0], "password": ADMIN[1]},
            timeout=30,
        )  # fmt: skip
        answer.raise_for_status()
        headers = {"Authorization": f"Bearer {answer.json()['access_token']}"}
        return httpx.Client(base_url=f"{self.url}/admin/realms", headers=headers, timeout=30)

    def import_realm(self, realm: dict[str, Any]) -> None:
        with self.admin() as admin:
            admin.post("", json=realm).raise_for_status()

    def client_uuid(self, admin: httpx.Client, realm: str, client_id: str) -> str:
        found = admin.get(f"/{realm}/clients", params={"clientId": client_id}).json()
        return str(found[0]["id"])

    def permit_exchange(
        self, realm: str, client_id: str, identity_provider: str, audiences: list[str]
    ) -> None:
        """Let ``client_id`` exchange tokens of ``identity_provider`` (external to internal)
        for tokens of ``audiences``: one client policy, granted the ``token-exchange``
        permission of the provider and of each audience client."""
        with self.admin() as admin:
            targets = [f"/{realm}/identity-provider/instances/{identity_provider}"]
            targets += [f"/{realm}/clients/{self.client_uuid(admin, realm, a)}" for a in audiences]
            permissions = []
            for target in targets:  # enabling them sets up realm-management's authorization
                enabled = admin.put(f"{target}/management/permissions", json={"enabled": True})
                enabled.raise_for_status()
                permissions.append(enabled.json()["scopePermissions"]["token-exchange"])
            management = self.client_uuid(admin, realm, "realm-management")
            server = f"/{realm}/clients/{management}/authz/resource-server"
            requester = self.client_uuid(admin, realm, client_id)
            policy = admin.post(
                f"{server}/policy/client",
                json={"name": f"{client_id}-exchanges", "clients": [requester]},
            )
            policy.raise_for_status()
            for permission in permissions:
                path = f"{server}/permission/scope/{permission}"
                body = admin.get(path).json()
                body["policies"] = [policy.json()["id"]]
                admin.put(path, json=body).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.keycloak")
    parser.add_argument("command", choices=("fetch", "run"))
    ns = parser.parse_args(argv)
    home = distribution()
    if ns.command == "fetch":
        print(home)
        return 0
    stop = False

    def stopping(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    with tempfile.TemporaryDirectory() as tmp, Keycloak(Path(tmp) / "keycloak.log", home) as kc:
        print(kc.url, flush=True)
        while not stop:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
