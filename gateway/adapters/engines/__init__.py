"""Engines behind the Engine port: the sandbox, Terraform (or OpenTofu), CloudFormation, and the router that picks one per stack."""
