"""transformers' float64 logits of the fortune demo, computed from the Hugging Face checkpoint that
the training script of its time saved (tests/fixtures/demo/hf) — never from g4's own export of it,
so that an export bug cannot hide in the oracle.

Random-weight fixtures amplify rounding layer by layer; a trained model does not, which makes this
the oracle for the bf16 tolerance (docs/DESIGN.md, "Oracles"). The text is longer than two sliding
windows, so the ring cache wraps. Runs where torch and transformers are installed (the GPU machine):

    python3 tools/demo_reference_logits.py tests/fixtures/demo/hf OUT_DIR

OUT_DIR receives reference_logits.f32 and reference.json (tools/make_fixtures.py's format).
"""
import json, os, sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_reference  # noqa: E402

TEXT = ("A fortune about computers: the program you wrote yesterday will do exactly what you told it, "
        "and nothing that you meant. Never trust a computer you cannot throw out of a window. "
        "To err is human, but to really foul things up you need a computer. "
        "A clean desk is a sign of a cluttered desk drawer. Today is the first day of the rest of your "
        "life, so back up your files before it ends. He who laughs last probably made a backup. "
        "The best way to predict the future is to implement it, then fix the bugs it brings. "
        "You will be surprised by a loud noise, and then by the silence of the machine room.")


def main():
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    ids = [config["bos_token_id"]] + tok.encode(TEXT, add_special_tokens=False).ids
    assert len(ids) > 2 * config["sliding_window"], "the text must be longer than two sliding windows"
    write_reference(hf_dir, ids, "all", {"text": TEXT}, out=out_dir)


if __name__ == "__main__":
    main()
