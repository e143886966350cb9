"""An S3-compatible endpoint on loopback for the tests: moto's standalone server (a real HTTP S3
API in a process of its own), behind a TCP relay the tests can take down and bring back.

The relay is the endpoint raylf is given (``AWS_ENDPOINT_URL``). Taking it down refuses new
connections and cuts open ones, as a storage endpoint that goes away does; the objects stay in
the server, as a real endpoint's outlive its outage (moto keeps them in memory: restarting it
would lose them). The server checks every request's signature and the IAM policy of its access
key, so a key without write permission is refused as on AWS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

BUCKET = "raylf-test"
REGION = "us-east-1"
STARTUP_S = 60.0


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.05)


class Relay:
    """Forwards TCP connections from a loopback port to ``target`` until :meth:`stop`; the
    port stays the same across :meth:`stop` and :meth:`start`."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = 0
        self.listener: socket.socket | None = None
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.start()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self.lock:
            for sock in self.open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # stopped
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.listener is not listener:  # stopped meanwhile
                    client.close()
                    server.close()
                    return
                self.open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self.lock:
                for sock in (source, sink):
                    if sock in self.open:
                        self.open.discard(sock)
                        sock.close()


class S3Endpoint:
    """moto's server on a free loopback port with one bucket and two IAM users: ``writer``
    (every S3 action) and ``reader`` (gets and lists only)."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="raylf-s3-"))
        self.log = self.folder / "server.log"
        server = Path(sys.executable).with_name("moto_server")
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", "0"],
                                         stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait(lambda: self._port() is not None or self.proc.poll() is not None, STARTUP_S,
                  "moto_server to listen")
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited:\n{self.log.read_text()[-3000:]}")
            self.server_url = f"http://127.0.0.1:{self._port()}"
            self.keys = self._set_up()
            self.relay = Relay(("127.0.0.1", self._port()))
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.relay.port}"

    def _port(self) -> int | None:
        found = re.search(r"Running on http://127\.0\.0\.1:(\d+)", self.log.read_text())
        return int(found.group(1)) if found else None

    def _set_up(self) -> dict[str, dict[str, str]]:
        """The bucket and the users, made before authentication is switched on."""
        import boto3

        session = boto3.Session(aws_access_key_id="setup", aws_secret_access_key="setup",
                                region_name=REGION)
        session.client("s3", endpoint_url=self.server_url).create_bucket(Bucket=BUCKET)
        iam = session.client("iam", endpoint_url=self.server_url)
        # moto names a HEAD of a bucket s3:HeadBucket (AWS checks s3:ListBucket for it)
        policies = {"writer": ["s3:*"], "reader": ["s3:Get*", "s3:List*", "s3:HeadBucket"]}
        keys = {}
        for user, actions in policies.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName=f"{user}-s3", PolicyDocument=json.dumps(
                {"Version": "2012-10-17",
                 "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                          "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        # from now on every request is authenticated and authorized
        urllib.request.urlopen(urllib.request.Request(
            f"{self.server_url}/moto-api/reset-auth", data=b"0", method="POST",
            headers={"Content-Type": "text/plain"}), timeout=30).read()
        return keys

    def env(self, user: str = "writer") -> dict[str, str]:
        """The variables a user sets on every node to point raylf (pyarrow, Tune) here."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
                **self.keys[user]}

    def uri(self, *parts: str) -> str:
        return "/".join((f"s3://{BUCKET}", *parts))

    def stop(self) -> None:
        self.relay.stop()

    def start(self) -> None:
        self.relay.start()

    def close(self) -> None:
        if getattr(self, "relay", None) is not None:
            self.relay.stop()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


def set_env(values: dict[str, str]) -> dict[str, str | None]:
    """Put ``values`` into this process's environment; return what they replaced."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return before


def restore_env(before: dict[str, str | None]) -> None:
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
