"""The demo model's corpus: Debian's fortunes, one example per quote, shuffled with the training seed.

Shared by tools/demo/train_demo.py (torch) and tools/demo/demo_heldout_text.py (plain Python), so the
held-out text is exactly the validation split the demo model never trained on.
"""
import os
import random

SEED = 20261130


def read_fortunes(corpus_dir):
    items = []
    for name in sorted(os.listdir(corpus_dir)):
        path = os.path.join(corpus_dir, name)
        # fortune's index files (.dat), its .u8 links and the licence are not quotes
        if name.isupper() or name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        topic = name.replace("-", " ")
        for block in text.split("\n%\n"):
            block = block.strip("\n")
            if 0 < len(block) <= 1200:
                items.append((topic, block))
    random.Random(SEED).shuffle(items)
    return items


def validation_count(n_examples):
    """The first 1/20 of the shuffled examples are the validation split."""
    return n_examples // 20
