"""Gemma-style tokenizer.json files: a BPE with byte fallback ("▁" for spaces, <0xNN> byte tokens at
Gemma's ids 238..493) that keeps Gemma 4's special and chat tokens at Gemma 4's ids (<pad> 0, <eos> 1,
<bos> 2, <unk> 3, <|turn> 105, <turn|> 106, ...). tools/demo/train_demo.py writes the demo model's with
learned merges; tools/fixtures/gpu_llamacpp_golden.sh gives the random test fixtures one (llama.cpp's
converter needs a tokenizer)."""

FIRST_BYTE_ID = 238  # <0x00> .. <0xFF> at Gemma's ids 238..493
GEMMA4_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 46: "<|tool>", 47: "<tool|>",
                   48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>",
                   52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>", 105: "<|turn>",
                   106: "<turn|>"}


def tokenizer_spec(pieces, merges):
    """The tokenizer.json object: specials, byte tokens, then `pieces` (ids in order) and `merges`."""
    vocab = {}
    for i in range(FIRST_BYTE_ID):
        vocab[GEMMA4_SPECIALS.get(i, f"<unused{i}>")] = i
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = FIRST_BYTE_ID + b
    for piece in pieces:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in sorted(GEMMA4_SPECIALS.items())]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return spec


if __name__ == "__main__":
    # A tokenizer of exactly VOCAB ids with three merges (llama.cpp refuses a BPE without merges)
    # and placeholder pieces after them, for the random fixtures:
    #   python3 tools/demo/gemma_style_tokenizer.py VOCAB OUT.json
    import json, sys
    vocab_size = int(sys.argv[1])
    pieces = ["▁", "t", "h", "e", "th", "▁t", "he"]
    first_placeholder = FIRST_BYTE_ID + 256 + len(pieces)
    assert vocab_size >= first_placeholder, f"a Gemma-style vocabulary needs at least {first_placeholder} ids"
    pieces += [f"<piece{i}>" for i in range(first_placeholder, vocab_size)]
    spec = tokenizer_spec(pieces, [["t", "h"], ["▁", "t"], ["h", "e"]])
    open(sys.argv[2], "w", encoding="utf-8").write(json.dumps(spec, ensure_ascii=False))
