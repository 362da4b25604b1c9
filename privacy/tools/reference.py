"""Reference (epsilon, delta) and RDP values for fedge-privacy's accountant.

Computes, with Google's dp-accounting (and Opacus's RDP analysis where it is installed), the
privacy of a table of subsampled Gaussian compositions, and prints them as JSON on standard
output. privacy/tools/reference.sh runs it in a pinned virtual environment and writes
privacy/tests/reference.json, which privacy/tests/reference.rs checks fedge against.

Usage: python reference.py --command "the command line to record" > reference.json
"""

import argparse
import importlib.metadata
import importlib.util
import json
import math
import platform
import sys

import numpy as np
from dp_accounting import dp_event
from dp_accounting import privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

# Orders at which single-step RDP values are recorded (a subset of the default orders, with
# fractional, small, large and the extreme ones).
RDP_ORDERS = [1.5, 2.0, 2.5, 3.3, 5.0, 8.0, 10.9, 16.0, 32.0, 63.0, 128.0, 256.0, 1024.0]

POISSON_RATES = [1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01]
SIGMAS = [0.5, 0.8, 1.0, 1.5, 2.0, 5.0]
STEPS = [1, 10, 100, 1000]
DELTAS = [1e-5, 1e-6]

# (sample size m, population n) for sampling without replacement.
FIXED_SIZES = [(10, 100), (5, 50), (20, 1000), (50, 100)]
FIXED_SIGMAS = [0.8, 1.0, 2.0, 5.0]
FIXED_STEPS = [1, 100, 1000]

# Compositions of steps with different parameters: lists of (q, sigma, steps).
MIXED = [
    [(0.01, 1.0, 500), (0.05, 2.0, 100)],
    [(0.1, 1.5, 50), (0.02, 0.8, 200), (1.0, 5.0, 3)],
    [(0.5, 2.0, 10), (0.2, 1.0, 10), (0.05, 0.5, 10)],
]


def finite_or_none(x):
    """JSON has no infinity: an unbounded value is written as null."""
    x = float(x)
    return x if math.isfinite(x) else None


def gaussian_event(q, sigma):
    if q == 1.0:
        return dp_event.GaussianDpEvent(sigma)
    return dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))


def standard_epsilon(orders, rdp, delta):
    """The standard conversion, min over orders of rdp - log(delta) / (order - 1)."""
    orders = np.asarray(orders, dtype=float)
    eps = np.asarray(rdp, dtype=float) - math.log(delta) / (orders - 1)
    i = int(np.argmin(eps))
    return float(eps[i]), float(orders[i])


def poisson_accountant(steps_list):
    acc = rdp_lib.RdpAccountant()
    for q, sigma, steps in steps_list:
        acc.compose(gaussian_event(q, sigma), steps)
    return acc


def epsilon_entry(acc, delta):
    eps, order = acc.get_epsilon_and_optimal_order(delta)
    std_eps, std_order = standard_epsilon(acc.orders, acc.rdp, delta)
    return {
        "delta": delta,
        "epsilon": finite_or_none(eps),
        "order": float(order),
        "epsilon_standard": finite_or_none(std_eps),
        "order_standard": std_order,
    }


def rdp_entry(sampling, q, sigma, values):
    return {
        "sampling": sampling,
        "q": q,
        "sigma": sigma,
        "rdp": [finite_or_none(v) for v in values],
    }


def load_opacus_rdp():
    """Opacus's RDP analysis module, loaded from its file: the package's __init__ imports torch,
    which the analysis itself does not need. None when Opacus is not installed."""
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = spec.submodule_search_locations[0] + "/accountants/analysis/rdp.py"
    mod_spec = importlib.util.spec_from_file_location("opacus_rdp_analysis", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--command", required=True, help="the command line to record")
    args = parser.parse_args()

    cases = []
    rdp_values = []
    for q in POISSON_RATES:
        for sigma in SIGMAS:
            rdp_values.append(
                rdp_entry(
                    "poisson",
                    q,
                    sigma,
                    rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, sigma, RDP_ORDERS),
                )
            )
            for steps in STEPS:
                acc = poisson_accountant([(q, sigma, steps)])
                for delta in DELTAS:
                    entry = {"sampling": "poisson", "steps": [[q, sigma, steps]]}
                    entry.update(epsilon_entry(acc, delta))
                    cases.append(entry)

    for history in MIXED:
        acc = poisson_accountant(history)
        for delta in DELTAS:
            entry = {"sampling": "poisson", "steps": [list(h) for h in history]}
            entry.update(epsilon_entry(acc, delta))
            cases.append(entry)

    replace_one = privacy_accountant.NeighboringRelation.REPLACE_ONE
    for m, n in FIXED_SIZES:
        for sigma in FIXED_SIGMAS:
            rdp_values.append(
                rdp_entry(
                    "fixed_size",
                    [m, n],
                    sigma,
                    rdp_lib._compute_rdp_sample_wor_gaussian(m / n, sigma, RDP_ORDERS),
                )
            )
            for steps in FIXED_STEPS:
                acc = rdp_lib.RdpAccountant(neighboring_relation=replace_one)
                event = dp_event.SampledWithoutReplacementDpEvent(
                    n, m, dp_event.GaussianDpEvent(sigma)
                )
                acc.compose(event, steps)
                entry = {"sampling": "fixed_size", "steps": [[[m, n], sigma, steps]]}
                entry.update(epsilon_entry(acc, 1e-5))
                cases.append(entry)

    opacus_cases = []
    opacus = load_opacus_rdp()
    opacus_orders = None
    if opacus is not None:
        opacus_orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
        for q in POISSON_RATES:
            for sigma in SIGMAS:
                for steps in STEPS:
                    rdp = opacus.compute_rdp(
                        q=q, noise_multiplier=sigma, steps=steps, orders=opacus_orders
                    )
                    for delta in DELTAS:
                        eps, order = opacus.get_privacy_spent(
                            orders=opacus_orders, rdp=rdp, delta=delta
                        )
                        opacus_cases.append(
                            {
                                "q": q,
                                "sigma": sigma,
                                "steps": steps,
                                "delta": delta,
                                "epsilon": finite_or_none(eps),
                                "order": float(order),
                            }
                        )

    packages = {"python": platform.python_version()}
    for name in ["dp-accounting", "opacus", "numpy", "scipy"]:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass

    out = {
        "about": "Reference values for fedge-privacy's RDP accountant, computed by dp-accounting "
        "(RdpAccountant, default orders) and Opacus's RDP analysis; null stands for +infinity.",
        "command": args.command,
        "packages": packages,
        "orders": [float(o) for o in rdp_lib.DEFAULT_RDP_ORDERS],
        "rdp_orders": RDP_ORDERS,
        "rdp": rdp_values,
        "cases": cases,
        "opacus_orders": opacus_orders,
        "opacus_cases": opacus_cases,
    }
    # One record per line: small enough to commit, and a diff shows which cases moved.
    fields = []
    for key, value in out.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n  ".join(json.dumps(v, separators=(",", ":")) for v in value)
            fields.append(f' "{key}": [\n  {rows}\n ]')
        else:
            fields.append(f' "{key}": {json.dumps(value)}')
    sys.stdout.write("{\n" + ",\n".join(fields) + "\n}\n")


if __name__ == "__main__":
    main()
