#!/usr/bin/env python3
"""Many streaming clients against a running `g4 serve`: what the server delivers under load.

Starts --clients threads at once; each streams one /v1/completions request after another until
--requests have been sent in total (default: one each), with the sampling of `g4 bench
--concurrency` (T 1, top-k 64, top-p 0.95, seed = request number) and a random prompt of
--prompt_chars letters. Prints one JSON object: generated tokens per second over the wall time
(from each request's usage chunk), time to first token p50/p99 (the first streamed chunk that
carries text) and the mean per-request decode speed, the figures `g4 bench --concurrency` prints for
the engine alone (docs/PERF.md, "g4 serve under load"). Python's standard library only: the GPU
machine has no network to install a client from.

  tools/gpu/serve_load.py --url http://127.0.0.1:8080 --clients 64 --prompt_chars 127 --max_tokens 64
"""
import argparse
import http.client
import json
import random
import statistics
import string
import sys
import threading
import time
import urllib.parse


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def stream_one(url, model, prompt, max_tokens, seed):
    """One streamed completion: (seconds to the first text, seconds in all, completion tokens)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "top_k": 64,
            "top_p": 0.95, "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first, tokens = None, None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error']}")
        if first is None and any(c.get("text") for c in chunk.get("choices", [])):
            first = time.perf_counter() - start
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    conn.close()
    if tokens is None:
        raise RuntimeError("no usage chunk")
    return first, time.perf_counter() - start, tokens


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=0, help="in total (default: one per client)")
    p.add_argument("--prompt_chars", type=int, default=127)
    p.add_argument("--max_tokens", type=int, default=64)
    a = p.parse_args()
    total = a.requests or a.clients
    parts = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    rng = random.Random(0)
    prompts = ["".join(rng.choice(string.ascii_lowercase) for _ in range(a.prompt_chars)) for _ in range(total)]
    results, failures, lock, next_request = [], [], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = next_request[0]
                next_request[0] += 1
            if i >= total:
                return
            try:
                first, seconds, tokens = stream_one(a.url, model, prompts[i], a.max_tokens, i)
                with lock:
                    results.append((first, seconds, tokens))
            except Exception as e:  # report every failure, keep the others running
                with lock:
                    failures.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(r[2] for r in results)
    firsts = [r[0] for r in results if r[0] is not None]
    decode = [(r[2] - 1) / (r[1] - r[0]) for r in results if r[0] is not None and r[2] > 1 and r[1] > r[0]]
    print(json.dumps({
        "clients": a.clients, "requests": total, "failed": len(failures), "failures": failures[:5],
        "generated_tokens": tokens, "wall_s": wall, "aggregate_tok_s": tokens / wall,
        "ttft_p50_s": percentile(firsts, 0.5), "ttft_p99_s": percentile(firsts, 0.99),
        "per_sequence_decode_tok_s": statistics.fmean(decode) if decode else None}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
