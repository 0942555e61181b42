"""Object-storage backends, one per URL scheme (``s3://``, ...): the one place that knows them.

A backend says, for the URLs of its scheme, how to open a zarr ``Store`` of the objects under
a URL (tensor stores, bundles), how to read its files through a ``pyarrow.fs`` filesystem
(a bundle's Parquet opened in place), how messages name its endpoint, which options are not
secret (what an archive's marker may remember), and what it can do (capability flags).
Everything else (``TensorStore``, ``ObjectStore``, gc's streamed listing, the archive marker,
bundles, the CLI) asks this registry, so a new scheme is one module that calls
:func:`register` (``tests/test_store_backends.py`` registers a ``gs://`` stub over a local
directory and ingests and reads through it).

The built-in ``s3`` backend (:mod:`dumpdb.storage.remote`) is registered on first lookup, so
importing this module costs nothing (no zarr, no obstore): ``dumpdb sql`` starts fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dumpdb.errors import StorageError

# scheme -> module whose import registers it (the built-in backends, loaded when first needed)
BUILTIN = {"s3": "dumpdb.storage.remote"}

_BACKENDS: dict[str, Backend] = {}


@dataclass(frozen=True)
class Capabilities:
    """What a tensor store can do, which its callers ask instead of testing its kind.

    ``files``: its objects are files on this machine (a store directory): worker processes
    of an ingest open it by path and write shards themselves, a failed write is the
    operating system's ``OSError`` (naming the file), and gc finds crash leftovers by
    walking directories (temporary names included). ``listing_meta``: its listing gives sizes
    and modification times (gc ages leftovers without a request per object). ``multipart``:
    large objects go up in parallel parts."""

    files: bool = False
    listing_meta: bool = False
    multipart: bool = False


LOCAL = Capabilities(files=True, listing_meta=True)  # a store directory on this machine (tensors.zarr)


@dataclass(frozen=True)
class Backend:
    """One URL scheme's object storage.

    ``canonical(url)``: the URL normalised (``scheme://BUCKET/PREFIX``); StorageError naming a
    malformed one. ``open_store(url, options, read_only)``: a zarr ``Store`` of the objects under
    ``url`` (nothing contacted yet). ``filesystem(url, options)``: ``(pyarrow.fs.FileSystem,
    path)`` for the objects under ``url``. ``endpoint(options)``: where requests go, for
    messages. ``public_options(options)``: the options without secrets.

    Capabilities: ``listing_meta`` (its listing gives sizes and modification times, so gc
    ages crash leftovers without a request per object); ``multipart`` (large objects go up in
    parallel parts). Object stores have no directories and no renames: a write is one whole
    PUT, and worker processes send their arrays back instead of writing files.
    """

    scheme: str
    canonical: Callable[[str], str]
    open_store: Callable[[str, Mapping[str, Any] | None, bool], Any]
    filesystem: Callable[[str, Mapping[str, Any] | None], tuple[Any, str]]
    endpoint: Callable[[Mapping[str, Any] | None], str]
    public_options: Callable[[Mapping[str, Any] | None], dict[str, str]]
    listing_meta: bool = False
    multipart: bool = False

    @property
    def capabilities(self) -> Capabilities:
        """This backend's :class:`Capabilities` (an object store: never ``files``)."""
        return Capabilities(listing_meta=self.listing_meta, multipart=self.multipart)


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one for URLs ``<backend.scheme>://...``; returns it."""
    _BACKENDS[backend.scheme] = backend
    return backend


def scheme_of(location: object) -> str | None:
    """The scheme of ``location`` when it is a URL of a known backend (``s3://B/P`` -> ``"s3"``),
    else None (a local path, or anything that is not a string)."""
    if not isinstance(location, str):
        return None
    scheme, sep, _ = location.partition("://")
    if not sep or not scheme.isalnum():
        return None
    return scheme if scheme in _BACKENDS or scheme in BUILTIN else None


def is_url(location: object) -> bool:
    """True if ``location`` is an object-storage URL of a known scheme rather than a path."""
    return scheme_of(location) is not None


def unfold(path: object) -> str | None:
    """``scheme://...`` if ``path`` is an object-storage URL that a ``pathlib.Path`` folded to
    ``scheme:/...`` (command-line options typed as paths), else None."""
    text = str(path) if path is not None else ""
    scheme, sep, rest = text.partition(":/")
    if sep and (scheme in _BACKENDS or scheme in BUILTIN):
        return f"{scheme}://{rest.lstrip('/')}"
    return None


def backend(url: str) -> Backend:
    """The backend of ``url``. Raises StorageError naming the URL (and the known schemes) when
    no backend has its scheme."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in _BACKENDS and scheme in BUILTIN:
        importlib.import_module(BUILTIN[scheme])  # registers itself
    found = _BACKENDS.get(scheme)
    if found is None:
        known = ", ".join(f"{s}://" for s in sorted(set(_BACKENDS) | set(BUILTIN)))
        raise StorageError(f"{url}: not an object-storage URL (known: {known}BUCKET/PREFIX)")
    return found


def canonical(url: str) -> str:
    """``url`` normalised by its backend (StorageError for a malformed or unknown one)."""
    return backend(url).canonical(url)


def open_store(url: str, options: Mapping[str, Any] | None = None, read_only: bool = False) -> Any:
    """A zarr Store of the objects under ``url`` (its backend's ``open_store``)."""
    return backend(url).open_store(url, options, read_only)


def endpoint(url: str, options: Mapping[str, Any] | None = None) -> str:
    """Where the requests for ``url`` go, for messages."""
    return backend(url).endpoint(options)


def describe(url: str, options: Mapping[str, Any] | None = None) -> str:
    """``<url> at <endpoint>``: how messages name a remote store (no secrets)."""
    return f"{url} at {endpoint(url, options)}"


def public_options(url: str, options: Mapping[str, Any] | None) -> dict[str, str]:
    """``options`` without secrets, as ``url``'s backend judges them."""
    return backend(url).public_options(options)
