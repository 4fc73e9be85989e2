#!/usr/bin/env bash
# Density (figures, not pass/fail): N idle sessions of template default on one
# kiln-host, in steps (DENSITY_STEPS, default "10 100 250 500 1000 2000", as far as memory goes): host memory
# (PSS) and CPU per idle sandbox, time to create each step, exec latency of
# `true` on a random idle session; then the same with KSM on. Bounded by
# DENSITY_BUDGET_S (600); destroys everything it started. See bench/density.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/density.py
