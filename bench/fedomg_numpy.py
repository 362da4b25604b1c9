#!/usr/bin/env python3
"""FedOMG's server step (docs/algorithms.md section 2) transcribed to numpy, float32 deltas on
OpenBLAS, as the peer that `fedge bench aggregate` measures itself against.

    python bench/fedomg_numpy.py --check              # the worked example, to 1e-6
    python bench/fedomg_numpy.py --n 100 --m 1000000  # timings as one JSON line

The step is what a numpy user would write: weight the deltas, one Gram matrix product, the
authors' 21-evaluation solver in float64, one weighted sum. Wall and CPU time cover the whole
step, from the N x M matrix of deltas to the new global vector.
"""

import argparse
import json
import time

import numpy as np


def solve(G, kappa, lr=25.0, momentum=0.5, evaluations=21):
    """The reference solver: returns (gamma, objective, lambda, coefficients)."""
    n = G.shape[0]
    s = np.sqrt(np.diag(G) + 1e-4).mean()
    G = G / s**2
    a = G.mean(axis=1)
    c = kappa * np.sqrt(a.mean() + 1e-4)

    def objective(gamma):
        return gamma @ a + c * np.sqrt(gamma @ G @ gamma + 1e-4)

    w = np.zeros(n)
    buf = None
    best_w, best_f = w.copy(), np.inf
    for step in range(evaluations):
        gamma = np.exp(w - w.max())
        gamma /= gamma.sum()
        f = objective(gamma)
        if f < best_f:
            best_f, best_w = f, w.copy()
        if step + 1 == evaluations:
            break
        gg = G @ gamma
        v = a + c * gg / np.sqrt(gamma @ gg + 1e-4)
        grad = gamma * (v - gamma @ v)
        buf = grad if buf is None else momentum * buf + grad
        w = w - lr * buf
    gamma = np.exp(best_w - best_w.max())
    gamma /= gamma.sum()
    lam = c / (np.sqrt(gamma @ G @ gamma + 1e-4) + 1e-4)
    coef = (1.0 / n + lam * gamma) / (1.0 + kappa**2)
    return gamma, best_f, lam, coef


def step(theta, deltas, counts, kappa=0.5, global_lr=1.0):
    """theta (M,) f32, deltas (N, M) f32, counts (N,) -> new theta (M,) f32 and gamma."""
    n = deltas.shape[0]
    p = (counts / counts.sum()).astype(np.float32)
    g = deltas * p[:, None]
    G = (g @ g.T).astype(np.float64)
    gamma, _, _, coef = solve(G, kappa)
    g_out = coef.astype(np.float32) @ g
    return theta + np.float32(global_lr * n) * g_out, gamma


def check():
    g = np.array([[1, 0, .5, -.2], [0, 1, .5, .1], [-.3, .2, 1, 0]], dtype=np.float64)
    gamma, f, _, coef = solve(g @ g.T, 0.5)
    g_out = coef @ g
    theta = np.array([.1, -.2, .3, .4]) + 0.5 * g_out
    want = {
        "gamma": [0.5502149834, 0.0672155945, 0.3825694221],
        "objective": [0.7856505870],
        "theta": [0.2779579292, -0.0120674882, 0.7010115382, 0.3665870888],
    }
    got = {"gamma": gamma, "objective": [f], "theta": theta}
    for key, values in want.items():
        np.testing.assert_allclose(got[key], values, rtol=1e-6)
    print("numpy transcription reproduces the worked example to 1e-6")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="clients")
    parser.add_argument("--m", type=int, default=1_000_000, help="parameters")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
    parser.add_argument("--check", action="store_true", help="run the worked example only")
    args = parser.parse_args()
    if args.check:
        check()
        return
    rng = np.random.default_rng(0)
    deltas = rng.standard_normal((args.n, args.m), dtype=np.float32) * np.float32(1e-2)
    counts = rng.integers(50, 500, size=args.n).astype(np.float64)
    theta = rng.standard_normal(args.m, dtype=np.float32)
    step(theta, deltas, counts)  # warm up BLAS threads and pages
    walls, cpus = [], []
    for _ in range(args.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        step(theta, deltas, counts)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    print(json.dumps({
        "n": args.n,
        "m": args.m,
        "wall_s": float(np.median(walls)),
        "cpu_s": float(np.median(cpus)),
        "numpy": np.__version__,
    }))


if __name__ == "__main__":
    main()
