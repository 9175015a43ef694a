"""Remote module sources, fetched as `terraform init` would, within the hosts, ports and sizes the settings allow."""
