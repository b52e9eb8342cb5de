"""Picks the committed part of tools/gpu_llamacpp_golden.sh's results (tests/fixtures/llamacpp/).

    python3 tools/llamacpp_golden_select.py RESULTS_DIR OUT_DIR

RESULTS_DIR holds the unpacked tarballs (demo/, tiny/). Kept: the llama.cpp-made GGUF files that
tests/test_llamacpp_files.cpp runs (the demo's Q4_0 and Q4_K_M, the fixture's Q8_0, Q4_0 and
Q4_K_M; the demo's 6.4 MB Q8_0 file stays out of the repository), llama.cpp's logits of each file
("native": its quantized CPU kernels) and of its F32 dequantization by llama-quantize
("dequantized"), every
8th position and the last for the demo, every position for the fixture, and in golden.json the
greedy completions and llama-perplexity's figures. Plain Python, no numpy.
"""
import json, os, re, shutil, sys

DEMO_TYPES = ["q8_0", "q4_0", "q4_k_m"]
COMMITTED_FILES = ["demo/demo-q4_0.gguf", "demo/demo-q4_k_m.gguf",
                   "tiny/tiny-q8_0.gguf", "tiny/tiny-q4_0.gguf", "tiny/tiny-q4_k_m.gguf"]


def copy_rows(src, dst, vocab, rows):
    data = open(src, "rb").read()
    row_bytes = vocab * 4
    with open(dst, "wb") as f:
        for r in rows:
            f.write(data[r * row_bytes:(r + 1) * row_bytes])


def completions(path):
    out, key = [], None
    for line in open(path, encoding="utf-8").read().split("\n"):
        m = re.match(r"=== completion \[(.*)\] (\S+)$", line)
        if m:
            key = {"prompt": m.group(1), "type": m.group(2), "text": ""}
            out.append(key)
        elif key is not None:
            key["text"] += line + "\n"
    for c in out:  # llama-completion echoes "<bos>" and the prompt, and ends with " [end of text]"
        text = c["text"].rstrip("\n").replace("<bos>", "", 1)
        assert text.startswith(c["prompt"]), c
        text = text[len(c["prompt"]):]
        c["ended"] = text.endswith(" [end of text]")
        c["text"] = text[:-len(" [end of text]")] if c["ended"] else text
    return out


def perplexity(log):
    text = open(log, encoding="utf-8").read()
    grab = lambda pattern: float(re.search(pattern, text).group(1))
    if "Mean PPL(Q)" not in text:
        return {"perplexity": grab(r"Final estimate: PPL = ([0-9.]+)")}
    return {"perplexity": grab(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)"), "mean_kl": grab(r"Mean\s+KLD:\s*([0-9.]+)"),
            "same_top_token": grab(r"Same top p:\s*([0-9.]+)") / 100}


def main():
    results, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for f in COMMITTED_FILES:
        shutil.copy(os.path.join(results, f), os.path.join(out, os.path.basename(f)))
    demo_ids = open(os.path.join(results, "demo/ids.txt")).read().strip().split(",")
    demo_rows = list(range(0, len(demo_ids), 8))
    if demo_rows[-1] != len(demo_ids) - 1:
        demo_rows.append(len(demo_ids) - 1)
    tiny_ids = open(os.path.join(results, "tiny/ids.txt")).read().strip().split(",")
    for name, vocab, rows, types in [("demo", 4096, demo_rows, DEMO_TYPES),
                                     ("tiny", 512, list(range(len(tiny_ids))), DEMO_TYPES)]:
        for t in types:
            for kind, suffix in [("native", ""), ("dequantized", "-f32")]:
                copy_rows(os.path.join(results, f"{name}/{name}-{t}{suffix}.llama.f32"),
                          os.path.join(out, f"{name}-{t}.{kind}.f32"), vocab, rows)
    golden = {
        "demo_rows": demo_rows,
        "demo_completions": completions(os.path.join(results, "demo/completions.txt")),
        "demo_perplexity": {t: perplexity(os.path.join(results, f"demo/ppl-{t}.log"))
                            for t in ["bf16"] + DEMO_TYPES},
        "heldout_llama_ids": json.loads(open(os.path.join(results, "demo/heldout.llama-ids.txt")).read()),
    }
    json.dump(golden, open(os.path.join(out, "golden.json"), "w"), indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
