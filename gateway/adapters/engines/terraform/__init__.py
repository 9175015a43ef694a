"""Terraform (or OpenTofu) behind the Engine port: the binary run in a data directory kept per stack, its schemas, its state sealed at rest."""
