"""The benchmark: Spec-Bench through our methods and peers, side by side in one run."""
