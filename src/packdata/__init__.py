"""packdata: the helper package behind the course *Feeding PyTorch from packed and sharded data*.

One module per idea, in the order the course meets them:

- ``data``      — generate the offline synthetic dataset; export real datasets to the same layout
- ``packing``   — pack a dataset folder into one ZIP or tar, deterministically, raw or encoded payloads
- ``tario``     — read tar headers by hand (pax and GNU records too), index a tar, scan a shard in memory
- ``datasets``  — PyTorch datasets over folders, archives and shards
- ``handles``   — one file handle per process for DataLoader workers; an audit of what workers read
- ``store``     — an emulated network store (HTTP with latency) and a dataset service with its client, on loopback
- ``shards``    — write, split, join and inspect tar shards (webdataset layout)
- ``streaming`` — stream shards: exactly once per epoch across ranks and workers, shuffled twice
- ``remote``    — upload datasets per object or as shards, stage them locally, map over shards
- ``s3``        — an S3-protocol server on loopback (moto); boto3 and s3fs found by one endpoint setting
- ``train``     — a small CNN and its train/evaluate loop, for the notebook and ``scripts/train.py``
- ``bench``     — measure a DataLoader configuration, count every sample
- ``storage``   — page-cache eviction, filesystem overhead, published storage figures
- ``costmodel`` — time ≈ requests × latency / concurrency + bytes / bandwidth, fitted and plotted
- ``system``    — versions, cores and accelerator of this machine
- ``exercises`` — generate exercise notebooks from solutions
- ``checks``    — the auto-checks that exercises call
- ``slides``    — build offline reveal.js decks from the lessons
- ``schedule``  — time every lesson and write the instructor guide's schedule
- ``hub``       — JupyterLab settings that open the ``.md`` lessons as notebooks
- ``cli``       — the ``packdata`` command
"""

__version__ = "0.1.0"
