"""The tensor store, the only package that touches ``tensors.zarr``.

* :mod:`~dumpdb.storage.objects`: :class:`ObjectStore`, the synchronous facade over a
  zarr Store through which every byte goes (ranged get, whole-object set, delete, list);
  a local store's reads go to its files without zarr (``ObjectStore.local``);
* :mod:`~dumpdb.storage.local`: :class:`DurableLocalStore`, zarr's LocalStore with
  fsync'd, rename-into-place writes (local archives);
* :mod:`~dumpdb.storage.store`: :class:`TensorStore` (reads, large arrays, faults) and
  :class:`StoreWriter` (packs of small payloads, one array per large payload);
* :mod:`~dumpdb.storage.shard`: encoding pack shards (Zarr ``sharding_indexed``);
* :mod:`~dumpdb.storage.payloads`: copying payloads and recording their
  ``blobs``/``arrays`` rows (ingest, import, export, gc).
"""
