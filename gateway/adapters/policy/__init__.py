"""Policy engines behind their ports: checkov beside the built-in rules, and main's Rego policies."""
