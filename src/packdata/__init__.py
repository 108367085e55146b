"""packdata: the helper package behind the course *Feeding PyTorch from packed and sharded data*.

One module per idea, in the order the course meets them:

- ``data``      — generate the offline synthetic dataset; export real datasets to the same layout
- ``datasets``  — PyTorch datasets over folders, archives and shards
- ``store``     — an emulated network store (HTTP with latency) on loopback
- ``bench``     — measure a DataLoader configuration, count every sample
- ``storage``   — page-cache eviction, filesystem overhead, published storage figures
- ``costmodel`` — time ≈ requests × latency + bytes / bandwidth, fitted and plotted
- ``system``    — versions, cores and accelerator of this machine
- ``exercises`` — generate exercise notebooks from solutions
- ``checks``    — the auto-checks that exercises call
- ``slides``    — build offline reveal.js decks from the lessons
- ``cli``       — the ``packdata`` command
"""

__version__ = "0.1.0"
