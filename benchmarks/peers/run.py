"""make bench-peers: the same photos through each tool's own writer and loader, read from the same
emulated network store, audited and timed side by side.

    .venv-peers/bin/python benchmarks/peers/run.py            # 1,000 photos, 3 rounds
    .venv-peers/bin/python benchmarks/peers/run.py --quick    # 100 photos, 1 round: judges nothing

For every tool (a driver ``tool_<name>.py`` each; see ``harness.py``):

1. convert the photos with the tool's own writer (timed; the bytes on disk counted);
2. serve every tool's files from one ``packdata.netstore.NetworkStore`` (a real HTTP server in its
   own process, the same latency per request for everybody);
3. run 2 ranks (2 processes with ``RANK``/``WORLD_SIZE``/``MASTER_*`` set, as ``torchrun`` sets
   them, in a gloo group), 2 loader workers each, batches of the same size, every image decoded and
   cropped to 224×224 the same way, for 2 epochs: the first from an empty local cache (time to first
   batch, samples/s), the second right after it (samples/s once the tool's own cache, if it keeps
   one, is warm). Every sample key is kept: each epoch is audited for duplicates and missing samples
   across both ranks, and the batches per rank compared. The tools take turns, round after round;
5. kill both ranks (SIGKILL to their whole process groups, DataLoader workers included) mid-epoch
   after each saved a checkpoint, restart them from it, and audit the epoch: samples delivered
   before the checkpoint plus after the restart, against the dataset.

Writes ``build/peers/report.md``, ``results.json`` and ``peers.png``; ``--quick`` writes the same
and judges nothing (with 100 photos, starting processes dominates every time).
"""

import argparse
import ast
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from packdata import photos, system  # noqa: E402
from packdata.compare import Comparison  # noqa: E402
from packdata.netstore import NetworkStore  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "build" / "peers"
HARNESS = HERE / "harness.py"
OURS = "ours"
OUR_ROWS = (OURS, "ours_cache")  # our stream, and the same through our shard cache
PEERS = ("webdataset", "wids", "nodes", "hf_webdataset", "hf_arrow", "litdata", "mosaic")
TOOLS = OUR_ROWS + PEERS
PYTHONS = {"peers": ROOT / ".venv-peers/bin/python", "mosaic": ROOT / ".venv-mosaic/bin/python"}
WORLD, WORKERS, SEED, SHARDS, LATENCY = 2, 2, 0, 10, 0.002
RUN_TIMEOUT = 600  # seconds for one job of 2 ranks
QUICK = {"size": "small", "batch": 8, "buffer": 20, "rounds": 1}
FULL = {"size": "workshop", "batch": 32, "buffer": 200, "rounds": 3}


class JobFailed(RuntimeError):
    """A tool's job did not finish: its log's last lines say why."""


# --- running jobs in the tools' environments ------------------------------------------------------


def venv_of(tool):
    """The side environment a driver names in its ``VENV``, read without importing it."""
    tree = ast.parse((HERE / f"tool_{tool}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "VENV":
            return ast.literal_eval(node.value)
    raise ValueError(f"tool_{tool}.py names no VENV")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(folder, rank=None, port=None):
    """The environment of a job's processes: one thread per process (every tool alike), the
    tools' default caches inside the job's ``folder``, and the rank variables ``torchrun`` would
    set."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(HF_HOME=str(folder / "hf-home"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    env.update(WIDS_CACHE=str(folder / "wids-cache"), TOKENIZERS_PARALLELISM="false")
    if rank is not None:
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
        env.update(LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def write_job(folder, job):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.json"
    path.write_text(json.dumps({**job, "out": str(folder)}))
    return path


def run_single(tool, job, folder):
    """Run a one-process job (convert, describe); its printed JSON."""
    path = write_job(folder, job)
    python = PYTHONS[venv_of(tool)]
    with (folder / "log.txt").open("w") as log:
        done = subprocess.run(
            [python, HARNESS, path],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=child_env(folder),
            timeout=RUN_TIMEOUT,
        )
    if done.returncode:
        raise JobFailed(log_tail(folder))
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_ranks(tool, job, folder):
    """Start the job's ranks, each in a process group of its own (its workers join it)."""
    path = write_job(folder, job)
    python, port = PYTHONS[venv_of(tool)], free_port()
    ranks = []
    for rank in range(WORLD):
        log = (folder / f"log-rank{rank}.txt").open("w")
        ranks.append(
            subprocess.Popen(
                [python, HARNESS, path],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(folder, rank, port),
                start_new_session=True,
            )
        )
        log.close()
    return ranks


def kill(ranks):
    """SIGKILL each rank's whole process group (the rank, its loader workers, their children)."""
    for process in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_for(ranks, folder, timeout=RUN_TIMEOUT):
    """Wait for every rank to end; ``JobFailed`` (the others killed) when one fails or all take
    longer than ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(process.poll() is None for process in ranks):
        failed = [p for p in ranks if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            kill(ranks)
            raise JobFailed(log_tail(folder))
        time.sleep(0.05)
    if any(process.returncode for process in ranks):
        raise JobFailed(log_tail(folder))


ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([\w.]+(?:Error|Exception|Expired)\b.*)$")


def log_tail(folder, lines=4):
    """Why a job failed, from its logs: the last exception named there, else the last lines."""
    tails = []
    for log in sorted(folder.glob("log*.txt")):
        text = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [match[1] for match in map(ERROR_LINE.match, text) if match]
        tails.append(errors[-1] if errors else f"{log.name}: " + " | ".join(text[-lines:]))
    return "; ".join(dict.fromkeys(tails)) or f"no log in {folder}"


def rank_results(folder):
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


# --- the lab --------------------------------------------------------------------------------------


class Lab:
    """One run of the lab: the photos, each tool's converted files, the store, the results."""

    def __init__(self, out, settings, root, latency, tools=TOOLS):
        self.out, self.settings, self.root, self.latency = out, settings, root, latency
        self.tools = tuple(tools)
        self.data, self.runs = out / "data", out / "runs"
        self.expected = json.loads((root / "manifest.json").read_text())["samples"]
        self.expected = [sample["key"] for sample in self.expected]
        self.results = {tool: {"rounds": [], "errors": {}} for tool in self.tools}

    def describe(self, tool):
        job = {"mode": "describe", "tool": tool}
        self.results[tool]["about"] = run_single(tool, job, self.runs / tool / "describe")

    def convert(self, tool):
        folder = self.data / tool
        shutil.rmtree(folder, ignore_errors=True)
        job = {"mode": "convert", "tool": tool, "root": str(self.root), "dest": str(folder)}
        job.update(shards=SHARDS)
        answer = run_single(tool, job, self.runs / tool / "convert")
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        self.results[tool].update(
            convert_seconds=answer["seconds"],
            bytes=sum(p.stat().st_size for p in files),
            files=[p.relative_to(folder).as_posix() for p in files],
        )

    def job(self, tool, mode, folder, cache=None, **extra):
        """A job's settings; ``cache`` (emptied first) defaults to one inside ``folder``."""
        cache = cache or folder / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        settings = {key: self.settings[key] for key in ("batch", "buffer")}
        return {
            "mode": mode,
            "tool": tool,
            "workers": WORKERS,
            "seed": SEED,
            "url": f"{self.store.url}{tool}/",
            "files": self.results[tool]["files"],
            "cache": str(cache),
            **settings,
            **extra,
        }

    def epochs(self, tool, round_):
        """One round of a tool: 2 epochs on 2 ranks from an empty cache."""
        folder = self.runs / tool / f"round{round_}"
        ranks = start_ranks(tool, self.job(tool, "epochs", folder, epochs=2), folder)
        wait_for(ranks, folder)
        shutil.rmtree(folder / "cache", ignore_errors=True)
        per_rank = [result["epochs"] for result in rank_results(folder)]
        self.results[tool]["rounds"].append(
            [
                {
                    "seconds": max(epochs[e]["seconds"] for epochs in per_rank),
                    "ttfb": max(epochs[e]["ttfb"] or float("nan") for epochs in per_rank),
                    "batches": [epochs[e]["batches"] for epochs in per_rank],
                    "audit": self.audit(epochs[e]["keys"] for epochs in per_rank),
                }
                for e in range(2)
            ]
        )

    def resume(self, tool):
        """Kill both ranks mid-epoch after a checkpoint, restart them from it, audit the epoch."""
        killed, resumed = self.runs / tool / "killed", self.runs / tool / "resumed"
        at = max(1, len(self.expected) // WORLD // self.settings["batch"] // 3)
        # the restart finds the same cache path (its job's settings), emptied: another machine
        cache = self.runs / tool / "resume-cache"
        ranks = start_ranks(tool, self.job(tool, "kill", killed, cache, at=at), killed)
        self.wait_for_checkpoints(ranks, killed)
        kill(ranks)
        job = self.job(tool, "resume", resumed, cache, **{"from": str(killed)})
        wait_for(start_ranks(tool, job, resumed), resumed)
        results = rank_results(resumed)
        unsupported = [r["after"]["unsupported"] for r in results if "unsupported" in r["after"]]
        if unsupported:
            self.results[tool]["resume"] = {"unsupported": unsupported[0]}
            return
        keys = [r["before"] + r["after"]["keys"] for r in results]
        before = [len(r["before"]) for r in results]
        self.results[tool]["resume"] = {"audit": self.audit(keys), "before": before}

    def wait_for_checkpoints(self, ranks, folder, timeout=RUN_TIMEOUT):
        """Wait until every rank has checkpointed and gone on (or failed)."""
        deadline = time.monotonic() + timeout
        while not all((folder / f"rank{rank}.progress").exists() for rank in range(WORLD)):
            if any(p.poll() is not None for p in ranks) or time.monotonic() > deadline:
                kill(ranks)
                raise JobFailed(log_tail(folder))
            time.sleep(0.05)

    def audit(self, key_lists):
        """Duplicates and missing samples of one epoch over all ranks."""
        seen = Counter(key for keys in key_lists for key in keys)
        expected = set(self.expected)
        return {
            "delivered": sum(seen.values()),
            "duplicates": sum(count - 1 for count in seen.values() if count > 1),
            "missing": len(expected - set(seen)),
            "unknown": len(set(seen) - expected),
        }

    def attempt(self, tool, step, *args):
        """Run one step of a tool; a failure is recorded against the tool and step, not fatal to the
        lab. A tool whose files could not be written, or whose epochs failed, goes no further."""
        errors = self.results[tool]["errors"]
        if set(errors) & {"describe", "convert", "epochs"}:
            return
        try:
            step(tool, *args)
        except (JobFailed, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as error:
            errors[step.__name__] = str(error)
            print(f"  {tool}: {step.__name__} FAILED {str(error)[:300]}", flush=True)

    def run(self, resume=True):
        for tool in self.tools:
            self.attempt(tool, self.describe)
            started = time.perf_counter()
            self.attempt(tool, self.convert)
            print(f"  converted for {tool} in {time.perf_counter() - started:.1f} s", flush=True)
        with NetworkStore(self.data, latency=self.latency) as self.store:
            for round_ in range(self.settings["rounds"]):
                turn = round_ % len(self.tools)
                order = self.tools[turn:] + self.tools[:turn]
                for tool in order:
                    self.attempt(tool, self.epochs, round_)
                    self.print_round(tool)
            for tool in self.tools if resume else ():
                self.attempt(tool, self.resume)
                print(f"  {tool}: resume {self.results[tool].get('resume')}", flush=True)
            self.requests = self.store.requests
        return self.results

    def print_round(self, tool):
        rounds = self.results[tool]["rounds"]
        if rounds and "epochs" not in self.results[tool]["errors"]:
            first, second = rounds[-1]
            print(
                f"  {tool:<14} first batch {first['ttfb']:.2f} s, "
                f"{len(self.expected) / first['seconds']:,.0f} then "
                f"{len(self.expected) / second['seconds']:,.0f} samples/s, "
                f"epoch audit {first['audit']}",
                flush=True,
            )


# --- the report -----------------------------------------------------------------------------------


def rates(results, samples, epoch):
    """``{tool: [samples/s of each round]}`` for ``epoch`` (0: first, 1: second), tools that ran."""
    return {
        tool: [samples / r[epoch]["seconds"] for r in result["rounds"]]
        for tool, result in results.items()
        if ran(result)
    }


def ran(result):
    """Whether a tool's timed epochs all ran."""
    return bool(result["rounds"]) and not set(result["errors"]) - {"resume"}


def title(results, tool):
    about = results[tool].get("about", {})
    return f"{about.get('title', tool)} {about.get('version', '')}".strip()


def audit_text(audit):
    if audit["duplicates"] == audit["missing"] == audit["unknown"] == 0:
        return "exact"
    return f"{audit['duplicates']} dup., {audit['missing']} missing"


def worst_audit(result):
    """The audit of the round and epoch with the most duplicates and missing samples."""
    audits = [epoch["audit"] for r in result["rounds"] for epoch in r]
    return max(audits, key=lambda a: a["duplicates"] + a["missing"] + a["unknown"])


def steps_text(result):
    counts = {tuple(epoch["batches"]) for r in result["rounds"] for epoch in r}
    text = ", ".join("/".join(map(str, c)) for c in sorted(counts))
    return text + (" (equal)" if all(len(set(c)) == 1 for c in counts) else " (unequal)")


def resume_text(result):
    if "resume" in result["errors"]:
        return "failed: " + result["errors"]["resume"].replace("|", "/")[:300]
    resume = result.get("resume")
    if resume is None:
        return "not run"
    if "unsupported" in resume:
        return f"not possible: {resume['unsupported']}"
    return audit_text(resume["audit"])


def table(results, samples):
    first, second = rates(results, samples, 0), rates(results, samples, 1)
    rows = [
        "| tool | written by | reads the store | conversion | on disk | first batch | "
        "samples/s, epoch 1 | samples/s, epoch 2 | each epoch | batches per rank | "
        "resume after a kill |",
        "|" + " --- |" * 11,
    ]
    for tool, result in results.items():
        about = result.get("about", {})
        if not ran(result):
            step, error = next(iter(result["errors"].items()), ("run", "did not run"))
            error = f"{step}: {error}".replace("|", "/")[:400]
            rows.append(
                f"| {title(results, tool)} | {about.get('writer', '')} | "
                f"{about.get('reads', '')} | failed: {error} |" + " |" * 7
            )
            continue
        ttfb = statistics.median(r[0]["ttfb"] for r in result["rounds"])
        rows.append(
            f"| {title(results, tool)} | {about['writer']} | {about['reads']} | "
            f"{result['convert_seconds']:.2f} s | {result['bytes'] / 1e6:.1f} MB | {ttfb:.2f} s | "
            f"{statistics.median(first[tool]):,.0f} | {statistics.median(second[tool]):,.0f} | "
            f"{audit_text(worst_audit(result))} | {steps_text(result)} | {resume_text(result)} |"
        )
    return "\n".join(rows)


def judge(results, samples, quick):
    """The target in words: each of our rows' second-epoch samples/s against the fastest peer that
    reads as it does in epoch 2 (from the store again, or from a local copy it kept), and against
    the fastest peer of all."""
    comparison = Comparison(rates(results, samples, 1))
    ours = [tool for tool in OUR_ROWS if tool in comparison.rates]
    peers = [tool for tool in comparison.rates if tool not in OUR_ROWS]
    if not ours or not peers:
        return "Our stream or every peer did not run: nothing to judge."
    words = {1: "target met", -1: "target missed: the peer is faster", 0: "no clear difference"}
    lines = []
    for tool in ours:
        keeps = results[tool]["about"].get("keeps")
        alike = [peer for peer in peers if results[peer]["about"].get("keeps") == keeps]
        fastest = max(alike or peers, key=comparison.median)
        kind = "keeps a local copy" if keeps else "reads the store every epoch"
        named = f"{title(results, tool)} / {title(results, fastest)} (the fastest peer that {kind})"
        verdict = "judged only in a full run" if quick else words[comparison.clearly(tool, fastest)]
        lines.append(f"- {named}, epoch 2: {comparison.ratio(tool, fastest)}: {verdict}.")
    fastest = max(peers, key=comparison.median)
    lines += [
        f"- {title(results, tool)} / {title(results, fastest)} (the fastest peer of all), epoch 2: "
        f"{comparison.ratio(tool, fastest)}"
        for tool in ours
    ]
    target = "Quick mode judges nothing: with 100 photos, starting processes dominates."
    if not quick:
        target = (
            "Target: ≥ 1× the fastest peer that reads as we do in epoch 2, every round. In epoch 2 "
            "a tool that kept a local copy reads it from disk, while a stream fetches every shard "
            "again through the store, whose server shares these 2 cores with the decoding."
        )
    return "\n".join([*lines, "", target])


def plot(results, samples, out):
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = {tool: title(results, tool) for tool in results}
    second = rates(results, samples, 1)
    Comparison({names[t]: r for t, r in second.items()}).plot(
        left, title="decoded samples/s, epoch 2, 2 ranks × 2 workers"
    )
    ttfb = {names[t]: [r[0]["ttfb"] for r in results[t]["rounds"]] for t in second}
    Comparison(ttfb, unit="seconds").plot(right, title="time to first batch (epoch 1)")
    right.set_yticklabels([])
    figure.tight_layout()
    figure.savefig(out / "peers.png", dpi=110)
    plt.close(figure)


def caveats(results):
    """A line for each tool whose row needs a word of explanation (its driver's ``CAVEAT``)."""
    return "".join(
        f"- **{title(results, tool)}**: {result['about']['caveat']}\n"
        for tool, result in results.items()
        if result.get("about", {}).get("caveat")
    )


def report(lab, seconds, quick):
    results, samples = lab.results, len(lab.expected)
    out = lab.out
    verdict = judge(results, samples, quick)
    plot(results, samples, out)
    versions = ", ".join(
        f"{r['about']['package']}=={r['about']['version']}"
        for r in results.values()
        if "about" in r
    )
    text = f"""# The peers lab (`make bench-{"peers-quick" if quick else "peers"}`)

{samples:,} photos ({lab.root.name}), {SHARDS} files of samples per tool, served by one emulated
network store (`packdata.netstore`, {lab.latency * 1e3:g} ms per request, its own process);
{WORLD} ranks (processes in a gloo group) × {WORKERS} loader workers, batches of
{lab.settings["batch"]}, every image decoded with PIL and cropped to 224×224
(`RandomResizedCrop`) in the workers, one thread per process; {lab.settings["rounds"]} round(s),
the tools taking turns. Measured on {time.strftime("%Y-%m-%d")}, {system.usable_cores()} cores,
{platform.platform(terse=True)}, Python {platform.python_version()}; the whole run took
{seconds:.0f} s.

{verdict}

{table(results, samples)}

- **first batch**: seconds from building the loader to the first batch (the slower rank), from an
  empty local cache; the median over the rounds.
- **samples/s**: both ranks' samples over the slower rank's time for the epoch, medians over the
  rounds. Epoch 1 starts from an empty cache (loader start, downloads); epoch 2 follows it, in new
  loader workers, with whatever the tool keeps in its own cache.
- **each epoch**: the worst round's audit of every key both ranks delivered, against the dataset.
- **resume after a kill**: both ranks SIGKILLed (with their workers) mid-epoch after saving a
  checkpoint, restarted from it; the samples delivered before the checkpoint plus after the restart,
  audited against the dataset.
- Versions: {versions}.
{caveats(results)}

![peers](peers.png)
"""
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n{verdict}\n\n{table(results, samples)}\n\nwrote {out / 'report.md'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 photos, 1 round: judges nothing")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    parser.add_argument("--rounds", type=int, help="rounds of the timed epochs")
    parser.add_argument("--latency", type=float, default=LATENCY, help="seconds per request")
    parser.add_argument(
        "--tools", nargs="+", choices=TOOLS, default=TOOLS, help="only these (a narrower run)"
    )
    parser.add_argument("--no-resume", action="store_true", help="skip the kill-and-resume audit")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    settings["rounds"] = args.rounds or settings["rounds"]
    started = time.perf_counter()
    root = photos.make_photos(size=settings["size"], progress=False)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.out / "runs", ignore_errors=True)
    lab = Lab(args.out, settings, root, args.latency, args.tools)
    print(f"{len(lab.expected):,} photos; tools: {', '.join(lab.tools)}", flush=True)
    lab.run(resume=not args.no_resume)
    report(lab, time.perf_counter() - started, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
