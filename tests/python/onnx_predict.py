"""Predicts images with a model `fedge-coordinator export` wrote, in onnxruntime, as a user
outside fedge would: the card (model.toml) says how to prepare an image and what comes out.

Usage: python tests/python/onnx_predict.py MODEL.toml IMAGE...
Prints one JSON line per image: file, class, index, probability, logits, probabilities.
Images at the card's size are used as they are; others are resized with Pillow's bilinear
filter (the card's fedge.resize), which gives fedge's pixels within one 8-bit level.
"""

import json
import pathlib
import sys
import tomllib

import numpy as np
import onnxruntime as ort
from PIL import Image


def prepare(card, path):
    """An image as the card's input tensor [1, ...]: channels, size, scale, mean, std, layout."""
    c, h, w = card["channels"], card["height"], card["width"]
    image = Image.open(path)
    image = image.convert("L" if c == 1 else "RGB")
    if image.size != (w, h):
        image = image.resize((w, h), Image.BILINEAR)
    x = np.asarray(image, dtype=np.float32).reshape(h, w, -1).transpose(2, 0, 1)
    x = x * np.float32(card.get("raw_max", 255.0) / 255.0)  # fedge's default: 8-bit values
    mean = np.array(card["mean"], dtype=np.float32)[:, None, None]
    std = np.array(card["std"], dtype=np.float32)[:, None, None]
    x = (x * np.float32(card["scale"]) - mean) / std
    if card.get("layout", "nchw") == "nhwc":
        x = x.transpose(1, 2, 0)
    return np.ascontiguousarray(x[None], dtype=np.float32)


def main():
    card_path = pathlib.Path(sys.argv[1])
    card = tomllib.loads(card_path.read_text())
    session = ort.InferenceSession(
        str(card_path.parent / card["file"]), providers=["CPUExecutionProvider"]
    )
    names = [card["output_name"], card["logits_name"]]
    for path in sys.argv[2:]:
        probabilities, logits = session.run(names, {card["input_name"]: prepare(card, path)})
        index = int(np.argmax(probabilities[0]))
        print(
            json.dumps(
                {
                    "file": path,
                    "class": card["classes"][index],
                    "index": index,
                    "probability": float(probabilities[0][index]),
                    "logits": [float(v) for v in logits[0]],
                    "probabilities": [float(v) for v in probabilities[0]],
                }
            )
        )


if __name__ == "__main__":
    main()
