"""PyTorch (CPU) trains the same head as `fedge bench head`, side by side.

Usage: python bench/head_torch.py FEDGE.json [FEDGE.json ...]
Each JSON file is what `fedge bench head --json` wrote for one shape and batch size. The same
head (Linear F→H, ReLU, Linear H→K), the same amount of random features in 0..1 with random
labels, the same batch size, epochs and optimiser (SGD with momentum and weight decay, the
learning rate of fedge's defaults), mean cross-entropy, a fresh shuffle per epoch; timed with
1 and 2 threads (`torch.set_num_threads`), median of 3 runs after a warm-up, as fedge does.
"""

import json
import statistics
import sys
import time

import torch


def train(cfg, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(7)
    f, h, k = cfg["features"], cfg["hidden"], cfg["classes"]
    n, epochs, batch = cfg["samples"], cfg["epochs"], cfg["batch_size"]
    x = torch.rand(n, f)
    y = torch.randint(0, k, (n,))
    rates, loss_value = [], float("nan")
    for run in range(4):  # one warm-up, three timed
        model = torch.nn.Sequential(torch.nn.Linear(f, h), torch.nn.ReLU(), torch.nn.Linear(h, k))
        opt = torch.optim.SGD(
            model.parameters(),
            lr=cfg["learning_rate"],
            momentum=cfg["momentum"],
            weight_decay=cfg["weight_decay"],
        )
        loss_fn = torch.nn.CrossEntropyLoss()
        start = time.perf_counter()
        for _ in range(epochs):
            order = torch.randperm(n)
            for i in range(0, n, batch):
                idx = order[i : i + batch]
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
            loss_value = loss.item()
        seconds = time.perf_counter() - start
        if run > 0:
            rates.append(n * epochs / seconds)
    return statistics.median(rates), loss_value


def main():
    print(f"PyTorch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    print("| head F→H→K | batch | fedge 1 thread | fedge 2 threads | PyTorch 1 thread | PyTorch 2 threads | fedge 1T / PyTorch 1T | fedge 2T / PyTorch 2T | naive f32 loops / PyTorch 1T |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        cfg = json.load(open(path))

        def fedge(backend, threads=1):
            rows = [r for r in cfg["results"] if r["backend"] == backend and r.get("threads", 1) == threads]
            return rows[0]["samples_per_s"] if rows else float("nan")

        f1, f2, plain = fedge("flex", 1), fedge("flex", 2), fedge("plain-f32")
        one, _ = train(cfg, 1)
        two, _ = train(cfg, 2)
        shape = f"{cfg['features']}→{cfg['hidden']}→{cfg['classes']}"
        print(
            f"| {shape} | {cfg['batch_size']} | {f1:,.0f} | {f2:,.0f} | {one:,.0f} | {two:,.0f} "
            f"| {f1 / one:.2f} | {f2 / two:.2f} | {plain / one:.2f} |"
        )


if __name__ == "__main__":
    main()
