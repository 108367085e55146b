"""packdata: the helper package behind the course *Feeding PyTorch from packed and sharded data*.

One module per idea, listed from the lowest layer up: a module imports only from its own layer and
the layers listed before it (``tests/test_architecture.py`` holds the package to that).

Bytes and processes
- ``system``      — versions, cores and accelerator of this machine
- ``atomic``      — files and folders that appear under their name only once complete
- ``perprocess``  — state of one process: file handles, connections, a function in a pool's workers
- ``readahead``   — the next shards fetched by a background thread while this one is read
- ``watchdog``    — DataLoader workers that end with their rank, even one killed outright
- ``engines``     — an executor on this machine's processes or on a Dask cluster, one interface
- ``torchrunenv`` — one rank's torchrun variables for a block: this process and its new workers
- ``ports``       — a free TCP port on loopback
- ``childserver`` — a server in a process of its own, started by a command, stopped by a line
- ``presigned``   — a presigned URL's one name however signed, its secrets kept out of messages
- ``httpclient``  — keep-alive HTTP client, a seekable file over Range GETs, file versions (ETags)
- ``images``      — JPEG encode, decode with PIL or TorchCodec, raw ``.npy`` pixels, payloads
- ``fields``      — a sample's fields from bytes: which member is the image, json, txt, npy
- ``compression`` — compressed shards (gzip, bzip2, xz) recognised and decompressed, or named

Tar
- ``tario``       — tar headers by hand: read (pax and GNU extensions too) and write
- ``tarindex``    — a tar's member index, stored next to it, rebuilt when stale
- ``tarscan``     — a whole shard in memory, every header checked at once with numpy

Data on disk
- ``imagefolder`` — the dataset folder: ImageFolder layout and a manifest with every SHA-256
- ``synthetic``   — the offline synthetic dataset, generated deterministically
- ``photos``      — ImageNet-sized synthetic photos: the same shapes on natural texture
- ``export``      — your own images or a torchvision dataset, into the same layout
- ``samples``     — where samples come from when something writes them: one source per input kind

Packed and sharded
- ``packing``     — pack a dataset folder into one ZIP or tar, raw or encoded payloads
- ``layout``      — the webdataset layout: members into samples, shard lists
- ``plaingroup``  — group a plain shard's members into samples with numpy
- ``shardread``   — read shards whole as samples; count and describe them
- ``memberread``  — a local shard of large samples, read member by member: no mapping, and its
                    table of members kept for the next epoch
- ``shardwrite``  — write, split and join shards, atomically as a set
- ``twopass``     — shuffle bigger than memory: scatter to buckets by a hashed key, shuffle each
- ``tartars``     — ImageNet's tar of tars: written from a folder, streamed into shuffled shards
- ``mapshards``   — map a function over every sample of every shard, a shard per task

Reading for training
- ``datasets``    — map-style datasets over folders, ZIPs and indexed tars, local or over HTTP
- ``resume``      — where a stream's worker is in its epoch, and the rest of an epoch after a kill
- ``checkpoint``  — every rank's loader state in a job's checkpoint, and the restart from it
- ``sampleseed``  — random augmentations that survive a resume: each sample's transform seeded by it
- ``bytebatch``   — undecoded samples batched as one tensor, to leave a worker in shared memory
- ``streaming``   — stream shards: exactly once per epoch across ranks and workers, shuffled twice
- ``audit``       — what DataLoader workers really read, checked against the manifest
- ``preemption``  — a training job killed for real and restarted from its checkpoint, audited
- ``rankaudit``   — which samples each rank reads under DistributedSampler: twice, never, resumed
- ``bench``       — measure a DataLoader configuration, count every sample
- ``compare``     — configurations measured in turn, round after round; verdicts only when clear
- ``enginebench`` — the same map over shards on a pool and on Dask, measured side by side
- ``ceiling``     — what workers could reach here: the same work in plain processes, in turn
- ``shufflebench`` — the two-pass shuffle measured: mix per batch, displacement, memory, time
- ``datawait``    — is the GPU waiting? each training step's wait for data apart from its compute
- ``train``       — a small CNN and its train/evaluate loop, for the lessons and
  ``scripts/train.py``

Storage and servers
- ``disks``       — page-cache eviction, per-file overhead, published storage figures
- ``costmodel``   — time ≈ requests × latency / concurrency + bytes / bandwidth, fitted and plotted
- ``netstore``    — an emulated network store: HTTP on loopback with latency and a bandwidth cap
- ``service``     — a dataset service (JSON API, uploads) on the same server, and its client
- ``transfer``    — upload datasets per object or as shards; stage shards to local scratch
- ``shardcache``  — remote shards cached on local disk: a byte limit, LRU, one download per shard
- ``cachebench``  — stream, stage or cache, measured side by side on the emulated store
- ``s3``          — an S3 server on loopback (moto, its own process); boto3, s3fs by one setting

Clusters
- ``localslurm``  — a one-node Slurm on loopback: munged, slurmctld, slurmd from a private folder
- ``multinode``   — torchrun "nodes" on this machine meeting in one c10d rendezvous

The command line
- ``cli``         — the ``packdata`` command

The course's own tooling (exercises, checks, slides, schedule, Lab settings) is the subpackage
``packdata.course``, installed with the ``course`` extra.
"""

__version__ = "0.1.0"
