"""The ``s3`` storage backend (:mod:`dumpdb.storage.backends`): tensor stores and bundles on S3
and S3-compatible object storage (AWS S3, Ceph RGW, SeaweedFS, MinIO, OBS).

A store URL is ``s3://BUCKET/PREFIX``; the objects of the store are the keys under
``PREFIX/`` in ``BUCKET`` (``packs/float32/<id>/c/0``, ``zarr.json``...), exactly the
keys a local ``tensors.zarr`` directory holds as files.

Client: :class:`zarr.storage.ObjectStore` over ``obstore``'s ``S3Store`` (Rust
``object_store``), which retries 5xx, throttling and dropped connections with exponential
backoff and jitter itself (why this client: ``docs/storage-design.md``, "S3 client").

Configuration (the AWS standard environment, then ``--storage-option KEY=VALUE``,
options win):

* ``AWS_ENDPOINT_URL`` (``endpoint``): e.g. ``http://127.0.0.1:8333`` for a local
  server; ``http://`` endpoints are allowed;
* ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``;
* ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (``region``, default ``us-east-1``);
* any other obstore ``S3Config`` key (``virtual_hosted_style_request``...), and the
  dumpdb keys ``retries`` (max retries, default 5), ``retry_timeout`` (seconds, 60),
  ``connect_timeout`` (seconds, 5), ``timeout`` (seconds per request, 300),
  ``multipart_bytes`` (objects at least this big go up as a parallel multipart upload,
  default 16 MiB), ``part_bytes`` (8 MiB), ``part_concurrency`` (8).

Secrets (keys, tokens) are never written to the archive nor printed:
:func:`public_options` is what an archive remembers, :func:`describe` what a message shows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zarr.abc.store import Store

from dumpdb.errors import StorageError

SCHEME = "s3://"
DEFAULT_REGION = "us-east-1"

# option keys that are secrets: accepted from the command line or the environment, never stored or shown
SECRET_KEYS = frozenset({"access_key_id", "secret_access_key", "session_token", "token", "aws_access_key_id",
                         "aws_secret_access_key", "aws_session_token", "key", "secret"})
# dumpdb's own keys (transport tuning), the rest go to obstore's S3Config
TUNING: dict[str, int | float] = {"retries": 5, "retry_timeout": 60.0, "connect_timeout": 5.0, "timeout": 300.0,
          "multipart_bytes": 16 << 20, "part_bytes": 8 << 20, "part_concurrency": 8}
_ENV = {"endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), "region": ("AWS_REGION", "AWS_DEFAULT_REGION")}


def is_url(location: object) -> bool:
    """True if ``location`` is an ``s3://`` URL (any scheme: :func:`dumpdb.storage.backends.is_url`)."""
    return isinstance(location, str) and location.startswith(SCHEME)


@dataclass(frozen=True)
class S3Location:
    """``s3://BUCKET/PREFIX`` split: ``bucket`` and ``prefix`` (no leading/trailing ``/``; may be empty)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """The canonical URL (``s3://bucket/prefix``)."""
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")

    def child(self, name: str) -> S3Location:
        """The location ``name`` below this one."""
        return S3Location(self.bucket, f"{self.prefix}/{name}".strip("/"))


def parse_url(url: str) -> S3Location:
    """Split ``s3://BUCKET[/PREFIX]``. Raises StorageError naming the URL when it is not one."""
    if not is_url(url):
        raise StorageError(f"{url}: not an object-storage URL (expected s3://BUCKET/PREFIX)")
    bucket, _, prefix = url[len(SCHEME):].partition("/")
    prefix = prefix.strip("/")
    if not bucket or any(c in bucket for c in " \\?#") or ".." in prefix.split("/") or "//" in prefix:
        raise StorageError(f"{url}: not a valid s3://BUCKET/PREFIX URL")
    return S3Location(bucket, prefix)


def public_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """``options`` without secrets: what an archive remembers next to its store URL."""
    return {k: str(v) for k, v in (options or {}).items() if k.lower() not in SECRET_KEYS}


def settings(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The effective configuration: environment (module docstring) overlaid by ``options``.

    Keys are lower-case obstore ``S3Config`` names plus dumpdb's tuning keys (as numbers).
    """
    conf: dict[str, Any] = {}
    for key, names in _ENV.items():
        for name in names:
            if os.environ.get(name):
                conf[key] = os.environ[name]
                break
    for key, value in (options or {}).items():
        key = key.lower()
        key = {"endpoint_url": "endpoint", "aws_endpoint_url": "endpoint", "aws_region": "region",
               "aws_access_key_id": "access_key_id", "aws_secret_access_key": "secret_access_key",
               "key": "access_key_id", "secret": "secret_access_key", "token": "session_token"}.get(key, key)
        conf[key] = value
    conf.setdefault("region", DEFAULT_REGION)
    for key, default in TUNING.items():
        try:
            conf[key] = type(default)(conf.get(key, default))
        except ValueError as exc:
            raise StorageError(f"--storage-option {key}: not a number") from exc
    return conf


def endpoint(options: Mapping[str, Any] | None = None) -> str:
    """The endpoint requests go to (for messages): the configured one or AWS's regional one."""
    conf = settings(options)
    return str(conf.get("endpoint") or f"https://s3.{conf['region']}.amazonaws.com")


def describe(url: str, options: Mapping[str, Any] | None = None) -> str:
    """``s3://bucket/prefix at <endpoint>``: how messages name a remote store (no secrets)."""
    return f"{url} at {endpoint(options)}"


def open_store(url: str, options: Mapping[str, Any] | None = None, read_only: bool = False) -> Store:
    """A zarr Store for the objects under ``url`` (``s3://BUCKET/PREFIX``).

    ``options``: ``--storage-option`` values (module docstring); the client is obstore
    (:class:`zarr.storage.ObjectStore`).
    Nothing is contacted here: an unreachable endpoint shows on first use (StorageError
    from :class:`~dumpdb.storage.objects.ObjectStore`). Raises StorageError for a bad URL.
    """
    loc = parse_url(url)
    conf = settings(options)
    try:
        from dumpdb.storage.s3 import open_obstore  # obstore is the optional 'dumpdb[s3]' dependency
    except ImportError as exc:
        raise StorageError(f"{url}: object storage needs obstore: pip install 'dumpdb[s3]' ({exc})") from exc

    try:
        return open_obstore(loc.bucket, loc.prefix, {k: str(v) for k, v in conf.items() if k not in TUNING}, conf,
                            read_only)
    except StorageError:
        raise
    except Exception as exc:  # obstore's configuration errors (unknown key, bad value)
        raise StorageError(f"{describe(url, options)}: bad storage configuration: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def filesystem(url: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(pyarrow.fs.S3FileSystem, "BUCKET/PREFIX")`` for the objects under ``url``: region,
    endpoint, credentials, retries and timeouts from :func:`settings`."""
    import pyarrow.fs

    loc = parse_url(url)
    conf = settings(options)
    kwargs: dict[str, Any] = {"region": conf["region"],
                              "retry_strategy": pyarrow.fs.AwsStandardS3RetryStrategy(
                                  max_attempts=int(conf["retries"])),
                              "connect_timeout": float(conf["connect_timeout"]),
                              "request_timeout": float(conf["timeout"])}
    endpoint_url = conf.get("endpoint")
    if endpoint_url:
        scheme, _, host = str(endpoint_url).partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    if conf.get("access_key_id"):
        kwargs.update(access_key=conf["access_key_id"], secret_key=conf.get("secret_access_key"),
                      session_token=conf.get("session_token"))
    return pyarrow.fs.S3FileSystem(**kwargs), f"{loc.bucket}/{loc.prefix}".rstrip("/")


def _register() -> None:
    from dumpdb.storage.backends import Backend, register

    register(Backend("s3", canonical=lambda url: parse_url(url).url,
                     open_store=lambda url, options, read_only: open_store(url, options, read_only),
                     filesystem=filesystem, endpoint=endpoint, public_options=public_options,
                     listing_meta=True, multipart=True))


_register()
