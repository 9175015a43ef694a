"""Reading HCL (python-hcl2) without planning: parsed trees, what a stack declares, which values are secret."""
