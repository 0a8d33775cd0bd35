"""The learning side: conformal maths, baselines, networks, V-trace, CPO trust region, trainers."""
