"""A real JupyterHub on this machine, for tests: its own hub, proxy and learner accounts.

    with HubTestbed(tmp_path, learners=2) as hub:     # two Unix users, hub + proxy on 127.0.0.1
        hub.url                                       # http://127.0.0.1:PORT  (the proxy: what a learner opens)
        hub.learners[0].name, hub.password            # log in with these (SharedPasswordAuthenticator)
        hub.api("GET", "/users")                      # hub REST API with the instructor's token
        hub.stop_server(name)                         # DELETE /users/NAME/server, waits until it is gone
        hub.start_server(name)                        # POST /users/NAME/server, waits until it is ready

HubTestbed(..., notebook_dir="~", room_service=True) roots each server in the home, as TLJH and Z2JH do (the
default, "~/notebooks", is common on workshop hubs), and runs `ppkit room --serve` as the hub's managed service
ppkit-room, as an unprivileged Unix user of its own (`hub.service_user`, as docs/workshop.md has TLJH do), which
the user `hub.instructor` (a hub user with the hub's password, given access:services!service=ppkit-room) may open
at /services/ppkit-room/. `activity_interval` sets the hub's last_activity_interval (300 s by default): how often
the hub copies the proxy's activity of each server, which the idle culler reads.

Each learner's server is JupyterLab (jupyterhub-singleuser from the Python running the tests), started by
LocalProcessSpawner as that learner's Unix user, on the course's notebooks copied into ~/notebooks, with this
checkout on PYTHONPATH. The instructor is a hub service whose token may list users, start, stop and reach
their servers: what `ppkit room` is given. Logging out stops a learner's server (shutdown_on_logout).

``stop()`` stops the hub (which stops the servers it runs and its proxy), then firmly whatever it started that
is left, then removes the learners (userdel -r); it returns what had to be killed, is idempotent and also runs
after a start that failed. A plain module, like tests/slurm_testbed.py.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
from hub_users import REPO, Learner, grant_traverse, missing_tools, revoke_traverse, unreadable_folders

START_TIMEOUT = 120.0  # s; importing jupyterhub and starting the proxy on a loaded 2-core machine
SERVER_TIMEOUT = 180  # s; a learner's JupyterLab imports a lot as a fresh user
INSTALL_HINT = ("`make hub` installs configurable-http-proxy (npm) and `pip install -e '.[test]'` jupyterhub; "
                "the learners need root (useradd)")


class HubTestbedError(RuntimeError):
    """The hub could not start, an API call failed, or something was left behind."""


class HubMissing(HubTestbedError):
    """jupyterhub, configurable-http-proxy or the tools for Unix users are missing (skip, or fail in CI)."""


def find_components() -> dict[str, str]:
    """Paths of jupyterhub, jupyterhub-singleuser and configurable-http-proxy; HubMissing names what is not here."""
    bin_dir = Path(sys.executable).parent
    found = {
        "jupyterhub": shutil.which("jupyterhub", path=str(bin_dir)),
        "jupyterhub-singleuser": shutil.which("jupyterhub-singleuser", path=str(bin_dir)),
        "configurable-http-proxy": shutil.which("configurable-http-proxy"),
    }
    missing = [name for name, where in found.items() if where is None] + missing_tools()
    if missing:
        raise HubMissing(f"JupyterHub testbed unavailable: {', '.join(missing)} not found; {INSTALL_HINT}.")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """\
c = get_config()  # noqa
c.JupyterHub.bind_url = {bind_url!r}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.db_url = {db_url!r}
c.JupyterHub.cookie_secret_file = {cookie_file!r}
c.JupyterHub.pid_file = {pid_file!r}
c.JupyterHub.shutdown_on_logout = True
c.JupyterHub.cleanup_servers = True
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.api_url = {proxy_api!r}
c.ConfigurableHTTPProxy.pid_file = {proxy_pid_file!r}
c.ConfigurableHTTPProxy.auth_token = {proxy_token!r}
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {password!r}
c.Authenticator.allowed_users = set({learners!r})
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = {notebook_dir!r}
c.Spawner.args = ["--ServerApp.terminals_enabled=False", "--LabApp.news_url=None",
                  "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                  "--LabApp.extension_manager=readonly"]
c.Spawner.environment = {environment!r}
c.Spawner.start_timeout = {server_timeout}
c.Spawner.http_timeout = {server_timeout}
c.JupyterHub.services = [{{"name": "instructor", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "instructor", "services": ["instructor"],
    "scopes": ["list:users", "read:users", "admin:servers", "access:servers"]}}]
"""
# The live view of the room (docs/workshop.md), as a managed service; the instructor is a user who may open it.
ROOM_SERVICE = """c.Authenticator.allowed_users.add({instructor!r})
c.JupyterHub.services.append({{"name": "ppkit-room", "url": {service_url!r}, "command": {command!r},
    "environment": {{"PYTHONPATH": {repo!r}}}, "oauth_no_confirm": True, "user": {user!r}, "cwd": "/"}})
c.JupyterHub.load_roles += [
    {{"name": "ppkit-room", "services": ["ppkit-room"],
      "scopes": ["list:users", "read:users", "read:servers", "access:servers"]}},
    {{"name": "room-viewer", "users": [{instructor!r}], "scopes": ["access:services!service=ppkit-room"]}},
]
"""


class HubTestbed:
    def __init__(self, root: Path, learners: int = 2, extra_env: dict[str, str] | None = None,
                 notebook_dir: str = "~/notebooks", room_service: bool = False, activity_interval: int | None = None):
        """notebook_dir: each server's root ("~": the home, as on TLJH and Z2JH); room_service: also run
        `ppkit room --serve` as the managed service ppkit-room, which the user `instructor` may open."""
        self.root = Path(root)
        self.tag = secrets.token_hex(3)
        self.names = [f"ppkhub{self.tag}{chr(ord('a') + i)}" for i in range(learners)]
        self.notebook_dir = notebook_dir
        self.room_service = room_service
        self.activity_interval = activity_interval
        self.service_user: Learner | None = None  # the Unix user ppkit-room runs as (room_service only)
        self.instructor = f"ppkhub{self.tag}i"  # a hub user only (no Unix account, no server): opens the page
        self.password = secrets.token_urlsafe(12)  # the learners' shared password (16 characters)
        self.token = secrets.token_hex(24)  # the instructor's (a hub service's) API token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.root / "jupyterhub.log"
        self.learners: list[Learner] = []
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen | None = None
        self.seen: dict[int, psutil.Process] = {}
        self.opened: dict[str, list[str]] = {}  # learner -> folders an ACL entry opened to them

    # ------------------------------------------------------------------ start / stop
    def __enter__(self) -> HubTestbed:
        return self.start()

    def __exit__(self, *exc) -> None:
        left = self.stop()
        if left and exc[0] is None:
            raise HubTestbedError(f"processes left after the hub stopped (killed now): {left}")

    @property
    def server_env(self) -> dict[str, str]:
        """What each learner's server gets: this Python's bin first on PATH, this checkout importable."""
        env = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
            "PYTHONPATH": str(REPO),
            "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
        }
        for key in ("PPKIT_TEST_OWNER", "CI"):  # the leftover checks find a test run's workers by the first
            if key in os.environ:
                env[key] = os.environ[key]
        env.update(self.extra_env)
        return env

    def start(self) -> HubTestbed:
        found = find_components()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            closed = unreadable_folders(Path(sys.executable), Path(sys.prefix), REPO)
            for name in self.names:
                self.learners.append(Learner.create(name))
                self.opened[name] = closed
                grant_traverse(name, closed)
            if self.room_service:
                self.service_user = Learner.create(f"ppkhub{self.tag}s")
                self.opened[self.service_user.name] = closed
                grant_traverse(self.service_user.name, closed)
            self.learners[0].check_can_import(sys.executable, self.server_env)
            self._write_config(found)
            self._start_hub(found["jupyterhub"])
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self, found: dict[str, str]) -> None:
        self.proxy_api, self.proxy_token = f"http://127.0.0.1:{free_port()}", secrets.token_hex(24)
        config = CONFIG.format(
            bind_url=self.url + "/", hub_port=free_port(), db_url=f"sqlite:///{self.root / 'hub.sqlite'}",
            cookie_file=str(self.root / "cookie_secret"), pid_file=str(self.root / "hub.pid"),
            proxy=found["configurable-http-proxy"], proxy_api=self.proxy_api,
            proxy_pid_file=str(self.root / "proxy.pid"), proxy_token=self.proxy_token,
            password=self.password, learners=self.names, singleuser=found["jupyterhub-singleuser"],
            environment=self.server_env, server_timeout=SERVER_TIMEOUT, token=self.token,
            notebook_dir=self.notebook_dir,
        )
        if self.room_service:
            command = [sys.executable, "-m", "ppkit", "room", "--serve", "--hub-url", self.url, "--every", "2",
                       "--idle-after", "0.25", "--users", *self.names]
            config += ROOM_SERVICE.format(instructor=self.instructor, service_url=f"http://127.0.0.1:{free_port()}",
                                          command=command, repo=str(REPO), user=self.service_user.name)
        if self.activity_interval is not None:
            config += f"c.JupyterHub.last_activity_interval = {self.activity_interval}\n"
        (self.root / "jupyterhub_config.py").write_text(config)

    def _start_hub(self, jupyterhub: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "JPY_"))}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [jupyterhub, "-f", str(self.root / "jupyterhub_config.py")], cwd=self.root, env=env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HubTestbedError(f"jupyterhub exited with code {self.proc.returncode} before it answered. "
                                      f"Its log ({self.log_path}):\n{self.log_tail()}")
            try:
                self.api("GET", "/")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise HubTestbedError(f"jupyterhub did not answer on {self.url} within {START_TIMEOUT:g} s. "
                              f"Its log ({self.log_path}):\n{self.log_tail()}")

    def note_processes(self) -> None:
        if self.proc is not None:
            try:
                for p in psutil.Process(self.proc.pid).children(recursive=True):
                    self.seen.setdefault(p.pid, p)
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> list[str]:
        """Stop the hub politely (SIGTERM: it stops its servers and proxy), then firmly; remove the learners."""
        left: list[str] = []
        if self.proc is not None:
            self.note_processes()
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    left.append(f"{self.proc.pid} jupyterhub (did not stop within 60 s of SIGTERM)")
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            _, alive = psutil.wait_procs(list(self.seen.values()), timeout=10)
            for p in alive:
                try:
                    left.append(f"{p.pid} {' '.join(p.cmdline()[:4])}")
                    p.kill()
                except psutil.Error:
                    pass
            self.proc = None
        for name, folders in self.opened.items():  # while the name still resolves
            revoke_traverse(name, folders)
        self.opened = {}
        for learner in [*self.learners, *([self.service_user] if self.service_user else [])]:
            left += [f"{entry} (user {learner.name})" for entry in learner.remove()]
        self.learners, self.service_user = [], None
        return left

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ the hub's REST API
    def api(self, method: str, path: str, body: dict | None = None):
        """Call /hub/api{path} with the instructor's token; the decoded JSON answer (None when empty)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/hub/api{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def route_activity(self, name: str) -> str | None:
        """configurable-http-proxy's last_activity of the route to NAME's server (its REST API, /api/routes): the
        time of the last answer it proxied there, which the hub copies as the server's activity for the culler."""
        req = urllib.request.Request(f"{self.proxy_api}/api/routes",
                                     headers={"Authorization": f"token {self.proxy_token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            routes = json.loads(resp.read())
        return next((r.get("last_activity") for path, r in routes.items() if path.rstrip("/") == f"/user/{name}"),
                    None)

    def server_running(self, name: str) -> bool:
        return bool(self.api("GET", f"/users/{name}")["servers"])

    def server_ready(self, name: str) -> bool:
        return bool((self.api("GET", f"/users/{name}")["servers"].get("") or {}).get("ready"))

    def wait_server(self, name: str, running: bool, timeout: float = SERVER_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while (self.server_ready(name) if running else self.server_running(name)) != running:
            if time.monotonic() > deadline:
                state = "start" if running else "stop"
                raise HubTestbedError(f"{name}'s server did not {state} within {timeout:g} s. "
                                      f"Hub log ({self.log_path}):\n{self.log_tail()}")
            time.sleep(0.5)
        self.note_processes()

    def stop_server(self, name: str) -> None:
        """What the admin page's "stop server" does: DELETE /hub/api/users/NAME/server, then wait for it."""
        self.note_processes()
        try:
            self.api("DELETE", f"/users/{name}/server")
        except urllib.error.HTTPError as exc:
            if exc.code != 202:
                raise
        self.wait_server(name, running=False)

    def start_server(self, name: str) -> None:
        """What the admin page's "start server" does: POST /hub/api/users/NAME/server, then wait until it runs."""
        try:
            self.api("POST", f"/users/{name}/server")
        except urllib.error.HTTPError as exc:
            if exc.code not in (201, 202, 400):  # 400: already running
                raise
        self.wait_server(name, running=True)

    def learner(self, name: str) -> Learner:
        return next(learner for learner in self.learners if learner.name == name)
