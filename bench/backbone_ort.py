"""Python's onnxruntime on the same ONNX backbone and batch sizes as `fedge bench backbone`.

Usage: python bench/backbone_ort.py CARD.toml FEDGE.json
Reads the model card (ONNX file, input name, layout, image size) and the figures fedge wrote
with `--json` (fedge running the backbone in tract and in ONNX Runtime, each with 1 thread and
with all), runs onnxruntime's CPU provider here with 1 thread and with all cores, and prints
images per second side by side with the ratios to Python's onnxruntime at the same thread count.
"""

import json
import os
import pathlib
import sys
import time
import tomllib

import numpy as np
import onnxruntime as ort


def session(onnx, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])


def images_per_s(sess, name, shape, images, batch):
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    sess.run(None, {name: x})  # warm-up, as fedge's first batch of each size
    runs = max(1, images // batch)
    start = time.perf_counter()
    for _ in range(runs):
        sess.run(None, {name: x})
    return runs * batch / (time.perf_counter() - start)


def main():
    card_path = pathlib.Path(sys.argv[1])
    card = tomllib.loads(card_path.read_text())
    tract = json.loads(pathlib.Path(sys.argv[2]).read_text())
    onnx = card_path.parent / card["file"]
    c, h, w = card["channels"], card["height"], card["width"]
    shape = (c, h, w) if card.get("layout", "nchw") == "nchw" else (h, w, c)
    cores = os.cpu_count() or 1
    one, every = session(onnx, 1), session(onnx, cores)
    fedge = {}
    for row in tract["rows"]:
        engine = "tract" if row["runtime"] == "tract" else "fedge-ort"
        fedge[(engine, row["threads"], row["batch"])] = row["images_per_s"]
    batches = sorted({b for (_, _, b) in fedge})
    print(f"{card['name']}: Python onnxruntime {ort.__version__}, {tract['images']} images per "
          f"batch size, {cores} cores; images/s (ratio to Python onnxruntime, same threads)")
    print("| batch | threads | fedge + tract | fedge + onnxruntime | Python onnxruntime |")
    print("|---|---|---|---|---|")
    cell = lambda v, ref: "–" if v is None else f"{v:.0f} ({v / ref:.2f}×)"
    for b in batches:
        o1 = images_per_s(one, card["input_name"], shape, tract["images"], b)
        oa = images_per_s(every, card["input_name"], shape, tract["images"], b)
        for threads, ref in (("1", o1), ("all", oa)):
            print(f"| {b} | {threads} | {cell(fedge.get(('tract', threads, b)), ref)} "
                  f"| {cell(fedge.get(('fedge-ort', threads, b)), ref)} | {ref:.0f} |")

if __name__ == "__main__":
    main()
