"""onnxruntime on the same ONNX backbone and batch sizes as `fedge bench backbone` (tract).

Usage: python bench/backbone_ort.py CARD.toml TRACT.json
Reads the model card (ONNX file, input name, layout, image size) and the figures fedge wrote
with `--json`, runs onnxruntime's CPU provider with 1 thread (tract runs on one) and with 2,
and prints images per second side by side with the ratio tract / onnxruntime.
"""

import json
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
    one, two = session(onnx, 1), session(onnx, 2)
    print(f"{card['name']}: onnxruntime {ort.__version__}, {tract['images']} images per batch size")
    print("| batch | tract img/s | onnxruntime 1 thread | onnxruntime 2 threads | tract / ort 1T | tract / ort 2T |")
    print("|---|---|---|---|---|---|")
    for row in tract["tract"]:
        b = row["batch"]
        t = row["images_per_s"]
        o1 = images_per_s(one, card["input_name"], shape, tract["images"], b)
        o2 = images_per_s(two, card["input_name"], shape, tract["images"], b)
        print(f"| {b} | {t:.0f} | {o1:.0f} | {o2:.0f} | {t / o1:.2f} | {t / o2:.2f} |")


if __name__ == "__main__":
    main()
