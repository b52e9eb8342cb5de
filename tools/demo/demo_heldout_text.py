"""Writes the demo model's held-out text: the first quotes of its validation split, never trained on.

    python3 tools/demo/demo_heldout_text.py CORPUS_DIR OUT_FILE [QUOTES=120]

The perplexity and KL-divergence table of docs/PERF.md (g4 perplexity beside llama-perplexity on
the same files) reads it; committed as tests/fixtures/demo/heldout.txt (fortune-mod's BSD licence,
see tools/demo/train_demo.py).
"""
import sys

from demo_corpus import read_fortunes, validation_count


def main():
    corpus_dir, out_file = sys.argv[1], sys.argv[2]
    quotes = int(sys.argv[3]) if len(sys.argv) > 3 else 120
    items = read_fortunes(corpus_dir)
    validation = items[:validation_count(len(items))]
    with open(out_file, "w", encoding="utf-8") as f:
        # One line, single spaces: llama.cpp's gemma4 tokenizer pre-splits at newlines where the
        # demo's tokenizer.json (and transformers) merge across them, so text with newlines would
        # give the two runtimes different tokens to score (docs/DESIGN.md §5).
        f.write(" ".join(" ".join(body.split()) for _, body in validation[:quotes]))
    print(f"{min(quotes, len(validation))} of {len(validation)} validation quotes -> {out_file}")


if __name__ == "__main__":
    main()
