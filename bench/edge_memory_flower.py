"""Peak memory of a Flower 1.42 + PyTorch client doing one fedge device's round of work.

Usage: python bench/edge_memory_flower.py [SAMPLES] [FEATURES] [HIDDEN] [CLASSES] [EPOCHS]
(defaults: one built-in digits domain as fedge-edge caches it, 270 training samples of 512
features, head 512→64→10, 5 local epochs at batch 32). It does what a Flower `NumPyClient.fit`
would: parameters in as numpy arrays, the head trained with SGD (momentum 0.9, weight decay
5e-4), parameters out as `ndarrays_to_parameters` in a `FitRes`, serialised to protobuf. No
backbone runs here (fedge's figure includes its tract backbone), so this is a lower bound for
the Flower client. Run it under `/usr/bin/time -v`; it prints its own peak (`ru_maxrss`).
"""

import resource
import sys

import numpy as np
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, serde
from flwr.proto.transport_pb2 import ClientMessage

n, f, h, k, epochs = (int(a) for a in (sys.argv[1:] + ["270", "512", "64", "10", "5"][len(sys.argv) - 1 :]))
torch.set_num_threads(1)
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.random((n, f), dtype=np.float32))
y = torch.from_numpy(rng.integers(0, k, n))
model = torch.nn.Sequential(torch.nn.Linear(f, h), torch.nn.ReLU(), torch.nn.Linear(h, k))
global_params = [p.detach().numpy().copy() for p in model.parameters()]
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
for _ in range(epochs):
    order = torch.randperm(n)
    for i in range(0, n, 32):
        idx = order[i : i + 32]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
local = [p.detach().numpy() for p in model.parameters()]
res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(local), n, {"train_loss": 0.0})
size = ClientMessage(fit_res=serde.fit_res_to_proto(res)).ByteSize()
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"Flower client work done: {n} samples, update {size} B, peak RSS {peak_mb:.1f} MB")
