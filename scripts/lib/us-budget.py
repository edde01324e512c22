#!/usr/bin/env python3
"""Where an origin's µs per request go, by part: reads `perf script` output (call graphs
of idem-origin under the bench) on stdin and puts each sample in the first part below
its call stack passes through. With a figure of µs per request (the bench's unprofiled
`origin µs/req`), prints each part's µs too.

    perf script -i redis-unique-c32.data | scripts/lib/us-budget.py 47
"""
import collections
import re
import sys

# In order: a sample goes to the first part whose frames it contains.
PARTS = [
    ("claim (store round trip, script, decode)", ["StoreExt::claim"]),
    ("completion (store write, replay-cache insert)", ["ClaimGuard::finish"]),
    ("the handler (demo charge, or the upstream call)", ["charges::create", "proxy::Upstream as tower_service"]),
    ("layer before the claim (route, scope, key, fingerprint)", ["service::guarded"]),
    ("layer around the handler (context, heartbeat start, answer)", ["IdempotencyService"]),
    ("heartbeat task", ["keep_alive"]),
    ("Redis connection task (writes, reads, parsing)", ["multiplexed_connection", "PipelineSink", "ValueCodec"]),
    ("HTTP server: read request, write answer (hyper)", ["serve_connection"]),
    # hyper's client connections run in tasks of their own (proxy mode).
    ("upstream connection task", ["hyper::proto::h1", "hyper::client", "hyper_util::client"]),
    ("runtime: scheduling, polling, parking", [""]),
]


def samples(lines):
    """Each sample's frames (leaf first) and whether its leaf is in the kernel."""
    frames, kernel = [], False
    for line in lines:
        if not line.strip():
            if frames:
                yield frames, kernel
            frames, kernel = [], False
        elif line[0] in " \t":
            parts = line.strip().split(" ", 1)
            if len(parts) == 2:
                symbol, _, dso = parts[1].rpartition(" (")
                if not frames:
                    kernel = "kernel" in dso
                frames.append(re.sub(r"\+0x[0-9a-f]+$", "", symbol))
    if frames:
        yield frames, kernel


def part_of(frames):
    # The layer before the claim is `guarded` without claim_and_execute below it.
    joined = "\n".join(frames)
    for name, needles in PARTS:
        if name.startswith("layer before") and "claim_and_execute" in joined:
            continue
        if any(n in joined for n in needles):
            return name
    return PARTS[-1][0]


def main():
    per_request = float(sys.argv[1]) if len(sys.argv) > 1 else None
    count, in_kernel, total = collections.Counter(), collections.Counter(), 0
    for frames, kernel in samples(sys.stdin):
        name = part_of(frames)
        count[name] += 1
        in_kernel[name] += kernel
        total += 1
    if total == 0:
        sys.exit("us-budget: no samples on stdin (perf script output expected)")
    print(f"| part | share | {'µs | ' if per_request else ''}of it in the kernel |")
    print(f"|---|---:|{'---:|' if per_request else ''}---:|")
    for name, _ in PARTS:
        n = count[name]
        if n:
            us = f" {per_request * n / total:.1f} |" if per_request else ""
            print(f"| {name} | {100 * n / total:.1f} % |{us} {100 * in_kernel[name] / n:.0f} % |")
    print(f"| (all: {total} samples) | 100 % |{f' {per_request:.1f} |' if per_request else ''} {100 * sum(in_kernel.values()) / total:.0f} % |")


if __name__ == "__main__":
    main()
