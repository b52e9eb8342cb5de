"""How far transformers itself lands from the float64 reference logits when it runs a fixture in
bfloat16 (and float32): the yardstick for the CUDA backend's bf16 error (docs/PERF.md).

    python3 tools/hf_bf16_error.py FIXTURES_DIR   # e.g. tests/fixtures/hf-gemma4
"""
import json, os, sys

import numpy as np
import torch
import transformers

root = sys.argv[1]
rows = []
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    meta = json.load(open(os.path.join(d, "reference.json")))
    ref = np.fromfile(os.path.join(d, "reference_logits.f32"), dtype=np.float32).reshape(meta["logits_shape"])
    arch = json.load(open(os.path.join(d, "config.json")))["architectures"][0]
    cls = getattr(transformers, arch)
    ids = torch.tensor([meta["token_ids"]], device="cuda")
    row = {"fixture": name}
    for dtype in (torch.bfloat16, torch.float32):
        model = cls.from_pretrained(d, dtype=dtype).cuda().eval()
        with torch.no_grad():
            got = model(input_ids=ids).logits[0].float().cpu().numpy()
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        row[str(dtype).replace("torch.", "") + "_relative_l2"] = rel
        row[str(dtype).replace("torch.", "") + "_greedy_agreement"] = float((got.argmax(-1) == ref.argmax(-1)).mean())
    rows.append(row)
    print(json.dumps(row), flush=True)
