"""onnxruntime on the model `fedge-coordinator export` wrote, against `fedge bench infer`.

Usage: python bench/infer_ort.py DIR
DIR is `fedge bench infer --out DIR` after `fedge-coordinator export --model DIR/model.bin
--out DIR/model.onnx` (bench/infer.sh runs the three). Reads the exported card
(DIR/model.toml: input name, layout, scale, mean, std), the images fedge timed (DIR/images.f32,
raw values at the card's input size) and fedge's logits (DIR/logits.f32); runs each image alone
(batch 1) with 1 thread and with 2, and prints latency (p50, p99), memory and the largest logit
difference beside fedge's figures (DIR/fedge.json).
"""

import json
import pathlib
import resource
import sys
import time
import tomllib

import numpy as np


def rss_mib(field="VmRSS:"):
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def normalised(card, raw):
    """The card's normalisation of raw [N, C, H, W] values, in its layout."""
    mean = np.array(card["mean"], dtype=np.float32)[None, :, None, None]
    std = np.array(card["std"], dtype=np.float32)[None, :, None, None]
    x = (raw * np.float32(card["scale"]) - mean) / std
    if card.get("layout", "nchw") == "nhwc":
        x = x.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x, dtype=np.float32)


def percentiles(ms):
    ms = np.sort(np.array(ms))
    at = lambda q: ms[int(round((len(ms) - 1) * q))]
    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "mean_ms": float(ms.mean())}


def main():
    out = pathlib.Path(sys.argv[1])
    fedge = json.loads((out / "fedge.json").read_text())
    card = tomllib.loads((out / "model.toml").read_text())
    c, h, w = fedge["input"]
    images = np.fromfile(out / "images.f32", dtype="<f4").reshape(-1, c, h, w)
    ours = np.fromfile(out / "logits.f32", dtype="<f4").reshape(len(images), -1)
    x = normalised(card, images)
    rss_before = rss_mib()
    import onnxruntime as ort

    rss_imported = rss_mib()
    rows = {}
    worst = 0.0
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(
            str(out / card["file"]), options, providers=["CPUExecutionProvider"]
        )
        names = [card["output_name"], card["logits_name"]]
        feed = card["input_name"]
        for i in range(min(10, len(x))):  # warm-up, as fedge's
            sess.run(names, {feed: x[i : i + 1]})
        ms = []
        for i in range(len(x)):
            start = time.perf_counter()
            _, logits = sess.run(names, {feed: x[i : i + 1]})
            ms.append((time.perf_counter() - start) * 1e3)
            worst = max(worst, float(np.abs(logits[0] - ours[i]).max()))
        rows[threads] = percentiles(ms)
        if threads == 1:
            rss_session = rss_mib()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    f = fedge["model"]
    head = "→".join(str(n) for n in fedge["head"])
    print(
        f"{fedge['backbone']} {c}x{h}x{w} + head {head}, {fedge['requests']} predictions at "
        f"batch 1; onnxruntime {ort.__version__} on the exported model"
    )
    print("| | p50 ms | p99 ms | speed of fedge ÷ this (p50) |")
    print("|---|---|---|---|")
    print(f"| fedge (tract), image tensor → probabilities | {f['p50_ms']:.3f} | {f['p99_ms']:.3f} | 1 |")
    p = fedge["png"]
    print(f"| fedge, PNG bytes → prediction (decode included) | {p['p50_ms']:.3f} | {p['p99_ms']:.3f} | |")
    for threads, r in rows.items():
        print(
            f"| onnxruntime, {threads} thread{'s' if threads > 1 else ''} | {r['p50_ms']:.3f} | "
            f"{r['p99_ms']:.3f} | {r['p50_ms'] / f['p50_ms']:.2f} |"
        )
    print(
        f"memory: fedge RSS {fedge['rss_before_mib']:.1f} MiB before loading, "
        f"{fedge['rss_model_loaded_mib']:.1f} MiB with the model, peak {fedge['peak_rss_mib']:.1f} MiB; "
        f"python {rss_before:.1f} MiB, {rss_imported:.1f} MiB with onnxruntime imported, "
        f"{rss_session:.1f} MiB with the session, peak {peak:.1f} MiB"
    )
    print(f"largest logit difference, onnxruntime against fedge: {worst:.2e}")
    if worst > 1e-4:
        sys.exit(f"the exported model disagrees with fedge by {worst:.2e} (> 1e-4)")


if __name__ == "__main__":
    main()
