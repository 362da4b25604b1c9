"""Bytes a Flower 1.42 client sends for the same head parameters as `fedge bench wire`.

Reads the JSON rows `fedge bench wire --json` wrote and, for each head shape (and with
FedDIM's compact class statistics when a row carries them), serialises the parameters the way
Flower does: numpy arrays saved with `np.save` into a `Parameters` message inside a `FitRes`
(the strategy API), and into an `ArrayRecord` with a `MetricRecord` in a `RecordDict` (the
Message API). Protobuf bytes only: gRPC/HTTP2 framing and TLS come on top, as MQTT headers do
for fedge (which the fedge figures include).

Usage: python bench/flower_wire.py target/bench-wire.json
"""

import json
import sys

import numpy as np
import flwr
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common import serde
from flwr.proto.transport_pb2 import ClientMessage


def arrays(f, h, k, feddim, rng):
    out = [
        rng.standard_normal((f, h)).astype(np.float32),
        rng.standard_normal(h).astype(np.float32),
        rng.standard_normal((h, k)).astype(np.float32),
        rng.standard_normal(k).astype(np.float32),
    ]
    if feddim:
        # FedDIM's compact statistics, as fedge sends them: class means [K, H] and counts.
        out += [rng.standard_normal((k, h)).astype(np.float32), np.full(k, 120, np.int32)]
    return out


def flower_bytes(nds):
    metrics = {"train_loss": 0.42, "val_accuracy": 0.9, "train_seconds": 1.5}
    fit_res = FitRes(
        status=Status(code=Code.OK, message="Success"),
        parameters=ndarrays_to_parameters(nds),
        num_examples=1200,
        metrics=metrics,
    )
    legacy = ClientMessage(fit_res=serde.fit_res_to_proto(fit_res)).ByteSize()
    content = RecordDict(
        {
            "arrays": ArrayRecord(nds),
            "metrics": MetricRecord({**metrics, "num-examples": 1200}),
        }
    )
    message_api = serde.recorddict_to_proto(content).ByteSize()
    return legacy, message_api


def main():
    rows = json.load(open(sys.argv[1]))
    rng = np.random.default_rng(0)
    print(f"Flower {flwr.__version__}, numpy {np.__version__}")
    header = (
        f"{'head F-H-K':<14} {'FedDIM':<7} {'Flower FitRes':>13} {'Flower Msg':>11} "
        f"{'fedge f32':>10} {'f16':>9} {'int8':>9} {'f32/Fl':>7} {'f16/Fl':>7} {'int8/Fl':>7}"
    )
    print(header)
    seen = {}
    for row in rows:
        s = row["shape"]
        key = (s["features"], s["hidden"], s["classes"], row["feddim"])
        seen.setdefault(key, {})[row["codec"]] = row["update_bytes"]
    for (f, h, k, feddim), fedge in seen.items():
        legacy, message_api = flower_bytes(arrays(f, h, k, feddim, rng))
        flower = min(legacy, message_api)
        print(
            f"{f'{f}-{h}-{k}':<14} {'yes' if feddim else 'no':<7} {legacy:>13} {message_api:>11} "
            f"{fedge['f32']:>10} {fedge['f16']:>9} {fedge['int8']:>9} "
            f"{fedge['f32'] / flower:>7.3f} {fedge['f16'] / flower:>7.3f} {fedge['int8'] / flower:>7.3f}"
        )
    print("ratios against the smaller of Flower's two messages")


if __name__ == "__main__":
    main()
